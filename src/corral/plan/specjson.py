"""A :class:`~corral.plan.spec.JobSpec` as versioned JSON, and back.

``launcher_options`` is written as its launcher's fields (``{"template": ...}``).
A document written before launcher options were typed, with the flat fields
``mlx_backend``, ``command_template``, ``madengine_tags`` and ``madengine_args``,
still loads. The env is written whole, secret values included: keep the JSON
where the job's env may be (a private file, a pipe), never in argv or a log.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from corral.errors import ConfigError
from corral.plan.launchers import OPTION_TYPES, launcher, launcher_options, launcher_options_json
from corral.plan.spec import JobSpec

SPEC_VERSION = 1
_FIELDS = {f.name for f in dataclasses.fields(JobSpec)}
_LEGACY = {old for kind in OPTION_TYPES for old in kind.LEGACY.values()}
_TUPLES = ("args", "secret_env", "workload_weights")


def spec_to_json(spec: JobSpec) -> dict[str, Any]:
    """``spec`` as a JSON-able dict, with its ``version``."""
    doc: dict[str, Any] = {"version": SPEC_VERSION}
    for name in sorted(_FIELDS):
        value = getattr(spec, name)
        if name == "launcher_options":
            value = launcher_options_json(value)
        elif name == "env":
            value = dict(value)
        elif name in _TUPLES:
            value = list(value)
        doc[name] = value
    return doc


def spec_from_json(doc: Mapping[str, Any], *, source: str = "spec") -> JobSpec:
    """The JobSpec of ``doc`` (ConfigError naming ``source`` and the field at fault)."""
    version = doc.get("version", SPEC_VERSION)
    if version != SPEC_VERSION:
        raise ConfigError(
            f"version {version!r}; this corral reads version {SPEC_VERSION}",
            source=source,
        )
    unknown = sorted(set(doc) - _FIELDS - _LEGACY - {"version"})
    if unknown:
        raise ConfigError(f"unknown field(s) {', '.join(unknown)}", source=source)
    values = {k: v for k, v in doc.items() if k in _FIELDS}
    name = str(values.get("launcher", "torchrun"))
    given = values.pop("launcher_options", None)
    legacy = {k: doc[k] for k in _LEGACY if k in doc}
    try:
        if given is not None:
            kind = launcher(name).options
            if kind is None or not isinstance(given, Mapping):
                raise ConfigError(f"launcher {name} takes no launcher_options", source=source)
            values["launcher_options"] = kind(**given)
        elif legacy:
            values["launcher_options"] = launcher_options(name, legacy)
        for key in _TUPLES:
            if key in values:
                values[key] = tuple(values[key])
        return JobSpec(**values)
    except TypeError as exc:
        raise ConfigError(str(exc), source=source) from exc
