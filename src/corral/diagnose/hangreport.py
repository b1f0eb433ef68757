"""Write the hang report: ``runs/<job>/hang/report.json`` and ``report.md``.

The I/O around :mod:`corral.diagnose.hangs`: the flight recorder dumps the agents
collected are written to ``hang/flight/rank_<rank>`` and read back with torch's
analyser, then the report goes next to the stack dumps. Without any dump the
report says why (``flight_recorder_error``: each rank's reason, as its agent gave it).
"""

from __future__ import annotations

import base64
import binascii
import contextlib
import json
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from corral.diagnose.hangs import (
    FlightFinding,
    hang_report,
    read_flight_recorder,
    render_markdown,
)
from corral.private import write_private
from corral.recovery.hang import RankKey

__all__ = ["write_hang_report"]

_REASONS = 8  # ranks' reasons quoted in flight_recorder_error before "and N more"


def _why_none(errors: Mapping[int, str]) -> str:
    """``flight_recorder_error`` when no dump arrived: every rank's reason (up to 8)."""
    if not errors:
        return "no flight recorder dump arrived (no rank was asked for one)"
    reasons = [errors[rank] for rank in sorted(errors)]
    more = f"; and {len(reasons) - _REASONS} more" if len(reasons) > _REASONS else ""
    return "no flight recorder dump arrived: " + "; ".join(reasons[:_REASONS]) + more


def _analyse(
    folder: Path, traces: Mapping[int, str], errors: dict[int, str]
) -> tuple[FlightFinding | None, str | None, dict[int, list[dict[str, Any]]]]:
    """Write the dumps (base64) to ``folder`` and read them: (finding, why there is
    none, each rank's last collectives). A dump that cannot be written joins ``errors``."""
    with contextlib.suppress(OSError):
        folder.mkdir(mode=0o700, parents=True, exist_ok=True)
    written = 0
    for rank, data in sorted(traces.items()):
        try:
            (folder / f"rank_{rank}").write_bytes(base64.b64decode(data, validate=True))
            written += 1
        except (ValueError, binascii.Error):
            errors[rank] = f"rank {rank}: its dump arrived garbled (not base64)"
        except OSError as exc:
            errors[rank] = f"rank {rank}: its dump could not be written to {folder}: {exc}"
    if not written:
        return None, _why_none(errors), {}
    try:
        flight, last = read_flight_recorder(folder)
    except ValueError as exc:
        return None, str(exc), {}
    return flight, None, last


def write_hang_report(
    directory: Path | None,
    message: str,
    stacks: Mapping[RankKey, str],
    paths: Mapping[RankKey, Path],
    traces: Mapping[int, str] | None = None,
    trace_errors: Mapping[int, str] | None = None,
) -> tuple[dict[str, Any], Path | None]:
    """The hang report (see :func:`~corral.diagnose.hangs.hang_report`) and where its
    markdown was written (None: no ``directory``, or it could not be written).
    ``traces``: each rank's flight recorder dump, base64; ``trace_errors``: why a
    rank has none."""
    errors = dict(trace_errors or {})
    last: dict[int, list[dict[str, Any]]] = {}
    flight_error: str | None
    if not traces:
        flight, flight_error = None, _why_none(errors)
    elif directory is not None:
        flight, flight_error, last = _analyse(directory / "flight", traces, errors)
    else:
        with tempfile.TemporaryDirectory(prefix="corral-flight-") as scratch:
            flight, flight_error, last = _analyse(Path(scratch), traces, errors)
    files = {key: str(path) for key, path in paths.items()}
    report = hang_report(
        message,
        stacks,
        flight=flight,
        flight_error=flight_error,
        files=files,
        last_collectives=last,
        flight_missing=errors,
    )
    if directory is None:
        return report, None
    markdown = directory / "report.md"
    try:
        directory.mkdir(parents=True, exist_ok=True)
        write_private(directory / "report.json", json.dumps(report, indent=2) + "\n")
        write_private(markdown, render_markdown(report))
    except OSError:
        return report, None
    return report, markdown
