"""The new-job form's option fields, generated from :class:`JobRequest`'s JSON schema:
same names, defaults and bounds as the API (and so as ``corral job submit``), so the
form cannot drift from the request it builds. Only the layout (which section, which
label) is written here; a field's type, default, bounds and hint come from the schema."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from functools import cache
from typing import Any, Literal

from corral.contract import QOS_CLASSES
from corral.service.models import JobRequest

Kind = Literal["checkbox", "number", "text", "select", "lines", "numbers"]
"""How a field is entered: a checkbox, a number, one line of text, a choice, one
string per line (a list of strings), or numbers separated by commas (a list of numbers)."""

SECTIONS: tuple[tuple[str, str, tuple[tuple[str, str], ...]], ...] = (
    (
        "launch",
        "Launch",
        (
            ("plugin_name", "Plugin (instead of the script)"),
            ("python", "Python on the machines"),
            ("workdir", "Working directory"),
            ("timeout", "Timeout (seconds)"),
            ("master_port", "Master port"),
            ("rdzv_timeout", "Rendezvous timeout (seconds)"),
            ("grace", "Grace at teardown (seconds)"),
            ("mlx_backend", "MLX backend"),
            ("qos", "QoS class (macOS)"),
            ("sync", "Sync the code directory before launch"),
            ("code_dir", "Code directory"),
        ),
    ),
    (
        "preflight",
        "Pre-flight",
        (
            ("smoke_test", "Collective smoke test"),
            ("check_links", "Check the links between machines"),
            ("links_min_ratio", "Slow link: below this share of the reference"),
            ("links_min_gbs", "Slow link: below this many GB/s"),
            ("links_warn_only", "Slow links only warn"),
            ("min_free_gb", "Free space for checkpoints (GB)"),
            ("consistency_threshold", "Code consistency threshold"),
            ("shared_data_path", "Shared data path"),
        ),
    ),
    (
        "fault",
        "Fault tolerance",
        (
            ("restart_backoff", "Restart backoff (seconds)"),
            ("host_timeout", "Host timeout (seconds)"),
            ("replicate_checkpoints", "Replicate checkpoints to the server"),
        ),
    ),
    (
        "network",
        "Network",
        (
            ("nccl_interface", "NCCL interface"),
            ("gloo_interface", "Gloo interface"),
        ),
    ),
    (
        "advanced",
        "Advanced",
        (
            ("secret_env", "Secret environment keys (one per line)"),
            ("after", "Start after these jobs succeed (job ids, one per line)"),
            ("workload_weights", "Workload weights (one per rank, comma-separated)"),
        ),
    ),
)
"""(id, title, ((field, label), ...)) of each collapsible section, in page order."""

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

CHOICES: dict[str, tuple[str, ...]] = {"qos": tuple(QOS_CLASSES)}
"""Choices of the fields the server checks with a validator instead of an enum."""


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
    choices = CHOICES.get(name) or tuple(prop.get("enum") or ())
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
        for section_id, title, fields in SECTIONS
    )
