"""Write the hang report: ``runs/<job>/hang/report.json`` and ``report.md``.

The I/O around :mod:`corral.diagnose.hangs`: the NCCL flight recorder dumps the
agents collected are written to ``hang/nccl/rank_<rank>`` and read back with
torch's analyser, then the report goes next to the stack dumps.
"""

from __future__ import annotations

import base64
import binascii
import contextlib
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from corral.diagnose.hangs import analyse_flight_recorder, hang_report, render_markdown
from corral.private import write_private
from corral.recovery.hang import RankKey

__all__ = ["write_hang_report"]


def write_hang_report(
    directory: Path | None,
    message: str,
    stacks: Mapping[RankKey, str],
    paths: Mapping[RankKey, Path],
    traces: Mapping[int, str] | None = None,
) -> tuple[dict[str, Any], Path | None]:
    """The hang report (see :func:`~corral.diagnose.hangs.hang_report`) and where its
    markdown was written (None: no ``directory``, or it could not be written).
    ``traces``: each rank's flight recorder dump, base64."""
    flight, flight_error = None, None
    if traces and directory is not None:
        folder = directory / "nccl"
        with contextlib.suppress(OSError):
            folder.mkdir(mode=0o700, parents=True, exist_ok=True)
        for rank, data in sorted(traces.items()):
            with contextlib.suppress(OSError, ValueError, binascii.Error):
                (folder / f"rank_{rank}").write_bytes(base64.b64decode(data, validate=True))
        try:
            flight = analyse_flight_recorder(folder)
        except ValueError as exc:
            flight_error = str(exc)
    files = {key: str(path) for key, path in paths.items()}
    report = hang_report(message, stacks, flight=flight, flight_error=flight_error, files=files)
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
