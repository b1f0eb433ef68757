"""The new-job form's option fields, generated from :class:`JobRequest`'s JSON schema,
itself generated from the job options' one schema (:mod:`corral.job.schema`): same
names, defaults, bounds and choices as the API (and so as ``corral job submit``), so
the form cannot drift from the request it builds. A job option's section and label are
the schema's; only the section titles and the request's own fields are written here."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from functools import cache
from typing import Any, Literal

from corral.job.schema import options_of
from corral.service.models import JobRequest

Kind = Literal["checkbox", "number", "text", "select", "lines", "numbers"]
"""How a field is entered: a checkbox, a number, one line of text, a choice, one
string per line (a list of strings), or numbers separated by commas (a list of numbers)."""

SECTIONS: tuple[tuple[str, str], ...] = (
    ("launch", "Launch"),
    ("preflight", "Pre-flight"),
    ("fault", "Fault tolerance"),
    ("network", "Network"),
    ("advanced", "Advanced"),
)
"""(id, title) of each collapsible section, in page order; a job option's section and
label are its schema's (:attr:`corral.job.schema.Option.section`)."""

REQUEST_ONLY: dict[str, tuple[tuple[str, str], ...]] = {
    "launch": (("plugin_name", "Plugin (instead of the script)"),),
    "advanced": (("after", "Start after these jobs succeed (job ids, one per line)"),),
}
"""The request's own fields (not job options) in a section, first: (field, label)."""


def section_fields(section: str) -> list[tuple[str, str]]:
    """(field, label) of a section: the request's own, then the job options placed there."""
    own = list(REQUEST_ONLY.get(section, ()))
    return own + [(f.name, o.label) for f, o in options_of("web") if o.section == section]


HINTS: dict[str, str] = {
    "python": "Interpreter on the machines (its torchrun is used); blank: the server's "
    "own for local machines, else python3.",
    "workdir": "Working directory on every machine; blank: for local machines their own "
    "directory under the run dir.",
    "timeout": "Stop the whole job after this many seconds (exit 124); blank: no limit.",
    "code_dir": "The code tree on the server that the machines' working directory must "
    "match, and that sync pushes.",
    "secret_env": "Their values (in Environment above) are redacted everywhere, never "
    "stored and never shown again.",
}
"""What the form says after a field's schema description (or instead of none)."""


@dataclass(frozen=True)
class FormField:
    """One generated input: its ``name`` (= id) is the request field's name."""

    name: str
    label: str
    kind: Kind
    default: Any
    hint: str = ""
    choices: tuple[str, ...] = ()
    minimum: float | None = None
    maximum: float | None = None
    integer: bool = False
    max_length: int | None = None
    nullable: bool = False

    @property
    def default_json(self) -> str:
        """The default as the script compares it (JSON)."""
        return json.dumps(self.default)

    @property
    def value(self) -> str:
        """The input's initial value: the default, blank for none."""
        if self.default is None or isinstance(self.default, bool | list):
            return ""
        return str(self.default)


@dataclass(frozen=True)
class FormSection:
    """A collapsible group of fields."""

    id: str
    title: str
    fields: list[FormField] = field(default_factory=list)


def _variant(prop: dict[str, Any]) -> tuple[dict[str, Any], bool]:
    """The property's non-null variant and whether null is allowed."""
    variants = prop.get("anyOf")
    if not variants:
        return prop, False
    real = [v for v in variants if v.get("type") != "null"]
    if len(real) != 1:
        raise ValueError(f"form: no single type in {prop}")
    return {**prop, **real[0]}, len(real) < len(variants)


def form_field(name: str, label: str, schema: dict[str, Any]) -> FormField:
    """The input of ``JobRequest.<name>`` as its JSON schema describes it."""
    prop, nullable = _variant(schema["properties"][name])
    kind: Kind
    kind_of = prop.get("type")
    choices = tuple(prop.get("enum") or ())
    if choices:
        kind = "select"
    elif kind_of == "boolean":
        kind = "checkbox"
    elif kind_of in ("integer", "number"):
        kind = "number"
    elif kind_of == "string":
        kind = "text"
    elif kind_of == "array":
        item = prop.get("items", {}).get("type")
        kind = "numbers" if item in ("integer", "number") else "lines"
    else:
        raise ValueError(f"form: JobRequest.{name} has no input for type {kind_of!r}")
    minimum = prop.get("minimum", prop.get("exclusiveMinimum"))
    maximum = prop.get("maximum", prop.get("exclusiveMaximum"))
    return FormField(
        name=name,
        label=label,
        kind=kind,
        default=prop.get("default", [] if kind_of == "array" else None),
        hint=" ".join(h for h in (prop.get("description", ""), HINTS.get(name, "")) if h),
        choices=choices,
        minimum=minimum,
        maximum=maximum,
        integer=kind_of == "integer",
        max_length=prop.get("maxLength"),
        nullable=nullable,
    )


@cache
def option_sections() -> tuple[FormSection, ...]:
    """The new-job form's generated sections, from JobRequest's JSON schema."""
    schema = JobRequest.model_json_schema()
    return tuple(
        FormSection(section_id, title, [form_field(n, label, schema) for n, label in fields])
        for section_id, title in SECTIONS
        for fields in [section_fields(section_id)]
    )
