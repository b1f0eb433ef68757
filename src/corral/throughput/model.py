"""The calibration file: seed 000's ``hardware_calibration`` shape, plus provenance.

``corral calibrate`` writes it and ``corral run --calibration FILE`` reads it::

    {"hardware_calibration": {
        "measured_performance": {"tb1": 412.0, "tb2": 205.3},      # host -> examples/s
        "workload_distribution": {"tb1": 0.667, "tb2": 0.333},     # host -> share
        "calibration_notes": "Throughput differs 2.01x ...",
        "when": "2026-05-01T10:00:00+00:00", "job_id": "...", "seconds": 30.0,
        "hosts": ["tb1", "tb2"], "script": null, "workload": "reference",
        "ranks": [{"rank": 0, "host": "tb1", "local_rank": 0,
                   "examples_per_s": 412.0, "share": 0.667, "fits": 256,
                   "step_fixed_s": 0.004, ...}, ...]}}

``measured_performance`` and ``workload_distribution`` are per host (the sum of
its ranks), as in the seed; ``ranks`` holds the per-rank figures the weights of
a run are taken from. ``script`` is the measured command (None: corral's
built-in reference workload); ``workload`` says which (``live``: figures taken
from a running job's reports, see :mod:`corral.job.drift`).
"""

from __future__ import annotations

import json
from datetime import datetime
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from corral.errors import ConfigError
from corral.private import write_private

__all__ = [
    "OPTION",
    "Calibration",
    "CalibrationFile",
    "RankRate",
    "Workload",
    "load_calibration",
    "save_calibration",
]

#: The option every error about a calibration file names.
OPTION = "--calibration"
SCHEMA_VERSION = 1

Workload = Literal["reference", "script", "live"]


class _Model(BaseModel):
    model_config = ConfigDict(frozen=True, extra="ignore")


class RankRate(_Model):
    """One rank's measured throughput and the share of the work it gets."""

    rank: int = Field(ge=0)
    host: str
    local_rank: int = Field(ge=0)
    examples_per_s: float = Field(gt=0, allow_inf_nan=False)
    share: float = Field(gt=0, le=1, allow_inf_nan=False)
    examples: float = Field(default=0.0, ge=0, allow_inf_nan=False)
    """Examples counted in the measurement window (after the warm-up)."""
    seconds: float = Field(default=0.0, ge=0, allow_inf_nan=False)
    """Length of the rank's measurement window."""
    reports: int = Field(default=0, ge=0)
    variation: float | None = None
    """Coefficient of variation of the rate between reports (None: too few reports)."""
    fits: int | None = Field(default=None, ge=1)
    """The largest micro-batch the rank fits, found by probing (None: not probed, or
    no limit found up to the probe's; see ``sdk.probe_fit``)."""
    step_fixed_s: float | None = Field(default=None, ge=0, allow_inf_nan=False)
    """Seconds the rank's step costs whatever its batch (None: not measured, as in
    files before it): its step takes ``step_fixed_s + b / examples_per_s``."""

    @property
    def overhead_examples(self) -> float:
        """The fixed step cost in examples the rank could process meanwhile (0: none)."""
        return (self.step_fixed_s or 0.0) * self.examples_per_s


class Calibration(_Model):
    """What one calibration measured (the content of ``hardware_calibration``)."""

    measured_performance: dict[str, float]
    workload_distribution: dict[str, float]
    calibration_notes: str
    when: datetime
    job_id: str
    seconds: float = Field(gt=0, allow_inf_nan=False)
    hosts: list[str]
    ranks: list[RankRate] = Field(min_length=1)
    script: list[str] | None = None
    workload: Workload = "reference"
    version: int = SCHEMA_VERSION

    def host_ranks(self, host: str) -> list[RankRate]:
        """The ranks measured on ``host``, by local rank."""
        return sorted((r for r in self.ranks if r.host == host), key=lambda r: r.local_rank)

    def fits(self) -> dict[str, int]:
        """Per host, the smallest micro-batch its ranks fit (hosts with a limit only)."""
        out: dict[str, int] = {}
        for r in self.ranks:
            if r.fits is not None:
                out[r.host] = min(out.get(r.host, r.fits), r.fits)
        return out

    def weights(self) -> tuple[float, ...]:
        """The measured shares in global rank order (the run that was measured)."""
        return tuple(r.share for r in sorted(self.ranks, key=lambda r: r.rank))


class CalibrationFile(_Model):
    """The file: seed 000's wrapper key around a :class:`Calibration`."""

    hardware_calibration: Calibration


def save_calibration(calibration: Calibration, path: str | Path) -> Path:
    """Write ``calibration`` to ``path`` (atomically, owner-only: the script's
    arguments may be private); returns the path."""
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    doc = CalibrationFile(hardware_calibration=calibration)
    write_private(target, doc.model_dump_json(indent=2) + "\n")
    return target


def load_calibration(path: str | Path) -> Calibration:
    """Read a calibration file; ConfigError (``--calibration``) naming the file and
    what is wrong with it."""
    source = Path(path)
    try:
        text = source.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError(
            f"calibration file {source} not found (run corral calibrate first)", option=OPTION
        ) from None
    except OSError as exc:
        raise ConfigError(
            f"cannot read calibration file {source}: {exc.strerror or exc}", option=OPTION
        ) from exc
    except UnicodeDecodeError:
        raise ConfigError(
            f"{source} is not a text file: not a file of corral calibrate", option=OPTION
        ) from None
    return parse_calibration(text, source)


def parse_calibration(text: str, source: str | Path) -> Calibration:
    """The calibration in ``text`` (a file of ``corral calibrate``, read from
    ``source``); ConfigError naming what is wrong with it."""
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ConfigError(
            f"{source} is not JSON (line {exc.lineno}: {exc.msg})", option=OPTION
        ) from None
    if not isinstance(data, dict) or "hardware_calibration" not in data:
        raise ConfigError(
            f"{source} has no 'hardware_calibration' object: not a file of corral calibrate",
            option=OPTION,
        )
    try:
        return CalibrationFile.model_validate(data).hardware_calibration
    except ValidationError as exc:
        error = exc.errors(include_url=False, include_input=False)[0]
        where = ".".join(str(p) for p in error["loc"])
        raise ConfigError(f"{source}: {where}: {error['msg']}", option=OPTION) from None
