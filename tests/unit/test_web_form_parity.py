"""One job model: every field of the API's JobRequest is on the web's new-job form (or
on an explicit list, with the reason), with the API's name, default, bounds and
choices; the generated option fields sit in the collapsible sections. The page is
rendered by the page handler's own template and context (no server)."""

from __future__ import annotations

import json
from html.parser import HTMLParser
from typing import Any, get_args

import annotated_types
import pytest
from pydantic import BaseModel

from corral.contract import QOS_CLASSES
from corral.service.models import ConfigScaling, JobRequest
from corral.web.form import SECTIONS, option_sections, section_fields
from corral.web.pages import templates

from .request_fields import NESTED, field_paths

FORM_NAME: dict[str, str] = {
    "resource_requirements.num_machines": "num_machines",
    "resource_requirements.gpus_per_machine": "gpus_per_machine",
    "resource_requirements.min_gpu_memory": "min_gpu_memory",
    "config_scaling.rule": "config_rule",
    # the single machine's select; the picker's checkboxes (made by the script from the
    # machine list) carry the name selected_machines
    "selected_machines": "machine",
}
"""The fields whose form control has another name than the field's."""
NOT_IN_FORM: dict[str, str] = {
    "config_scaling.batch_size_key": "the config's key names: the form adjusts the keys "
    "corral.sdk.scale_config uses by default; a JSON body (or the CLI) sets others",
    "config_scaling.lr_key": "as config_scaling.batch_size_key",
    "config_scaling.output_dir_key": "as config_scaling.batch_size_key",
}
"""The fields the form does not offer, and why."""
SECTION_TITLES = ["Launch", "Pre-flight", "Fault tolerance", "Network", "Advanced"]


class _Controls(HTMLParser):
    """The form's controls (input, select, textarea) by name, their options, and the
    ``<details>`` section each sits in."""

    def __init__(self) -> None:
        super().__init__()
        self.controls: dict[str, dict[str, str | None]] = {}
        self.options: dict[str, list[str]] = {}
        self.selected: dict[str, str] = {}
        self.section_of: dict[str, str] = {}
        self.summaries: list[str] = []
        self._select: str | None = None
        self._details: str | None = None
        self._summary: list[str] | None = None

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        found = dict(attrs)
        if tag == "details":
            self._details = found.get("data-section")
        elif tag == "summary":
            self._summary = []
        elif tag in ("input", "select", "textarea") and found.get("name"):
            name = str(found["name"])
            self.controls.setdefault(name, {**found, "tag": tag})
            if self._details:
                self.section_of[name] = self._details
            if tag == "select":
                self._select = name
                self.options[name] = []
        elif tag == "option" and self._select:
            self.options[self._select].append(str(found.get("value")))
            if "selected" in found:
                self.selected[self._select] = str(found.get("value"))
        elif self._summary is not None:
            self._summary.append("")  # a nested element: its text is not the title

    def handle_data(self, data: str) -> None:
        if self._summary is not None and not self._summary:
            self._summary.append(data.strip())

    def handle_endtag(self, tag: str) -> None:
        if tag == "select":
            self._select = None
        elif tag == "details":
            self._details = None
        elif tag == "summary" and self._summary is not None:
            self.summaries.append(self._summary[0] if self._summary else "")
            self._summary = None


@pytest.fixture(scope="module")
def form() -> _Controls:
    html = templates.env.get_template("new_job.html").render(
        title="New job",
        csrf="c",
        version="0",
        user="u",
        role="user",
        can_submit=True,
        is_admin=False,
        nav="new",
        option_sections=option_sections(),
    )
    parser = _Controls()
    parser.feed(html)
    return parser


def _field(path: str) -> Any:
    model: type[BaseModel] = JobRequest
    *outer, name = path.split(".")
    for part in outer:
        model = NESTED[part]
    return model.model_fields[name]


def _generated() -> list[str]:
    return [name for section, _ in SECTIONS for name, _ in section_fields(section)]


@pytest.mark.parametrize("path", field_paths())
def test_every_request_field_is_on_the_form(form: _Controls, path: str) -> None:
    if path in NOT_IN_FORM:
        return
    name = FORM_NAME.get(path, path)
    assert name in form.controls, (
        f"JobRequest.{path} is not on the new-job form: give its option a section "
        "(corral.job.schema) or an input in the template, or list it in NOT_IN_FORM with the reason"
    )


def test_the_lists_name_only_real_fields() -> None:
    assert set(FORM_NAME) | set(NOT_IN_FORM) <= set(field_paths())
    assert set(_generated()) <= set(JobRequest.model_fields)
    assert len(_generated()) == len(set(_generated()))


def test_the_options_are_in_collapsible_sections(form: _Controls) -> None:
    assert form.summaries == SECTION_TITLES
    for name in _generated():
        assert name in form.section_of, f"{name} is not in a <details> section"
    assert form.section_of["check_links"] == "preflight"
    assert form.section_of["grace"] == "launch"
    assert form.section_of["nccl_interface"] == "network"


@pytest.mark.parametrize("name", _generated())
def test_a_generated_field_has_the_apis_default(form: _Controls, name: str) -> None:
    control = form.controls[name]
    default = JobRequest.model_fields[name].get_default(call_default_factory=True)
    assert control["data-option"] == name
    assert json.loads(str(control["data-default"])) == default
    if control.get("type") == "checkbox":
        assert ("checked" in control) is bool(default)
    elif control["tag"] == "select":
        assert form.selected[name] == ("" if default is None else default)
    elif control["tag"] == "input" and default is not None:
        assert float(str(control["value"])) == default


def _bounds(path: str) -> tuple[float | None, float | None]:
    """The field's lower and upper bound (inclusive or not), as its metadata says."""
    low = high = None
    for item in _field(path).metadata:
        if isinstance(item, annotated_types.Ge | annotated_types.Gt):
            low = item.ge if isinstance(item, annotated_types.Ge) else item.gt
        if isinstance(item, annotated_types.Le | annotated_types.Lt):
            high = item.le if isinstance(item, annotated_types.Le) else item.lt
    return low, high  # type: ignore[return-value]


@pytest.mark.parametrize("path", [p for p in field_paths() if p not in NOT_IN_FORM])
def test_a_number_field_has_the_apis_bounds(form: _Controls, path: str) -> None:
    control = form.controls.get(FORM_NAME.get(path, path), {})
    if control.get("type") != "number":
        return
    low, high = _bounds(path)
    shown = [None if control.get(k) is None else float(str(control[k])) for k in ("min", "max")]
    assert shown == [low, high], f"{path}: the form says {shown}, the API {low, high}"


def test_the_choices_are_the_apis(form: _Controls) -> None:
    literal = {
        "launcher": "launcher",
        "recovery": "recovery",
        "mlx_backend": "mlx_backend",
    }
    for name, field in literal.items():
        assert form.options[name] == list(get_args(JobRequest.model_fields[field].annotation))
    assert form.options["qos"] == ["", *QOS_CLASSES]  # "": not set (the API's default)
    # the rule's third value, none, is the unchecked "Adjust config" box
    rules = get_args(ConfigScaling.model_fields["rule"].annotation)
    assert form.options["config_rule"] == [r for r in rules if r != "none"]
