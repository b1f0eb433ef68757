"""The supervisor's side of hang detection: feed the detector, keep the dumps.

:mod:`corral.recovery.hang` decides (pure); this keeps its clock (the
coordinator's ``time.monotonic()`` when a report arrives), writes every rank's
stack to ``runs/<job>/hang/<host>.<rank>.txt``, the hang report
(:mod:`corral.diagnose.hangs`: ``report.json`` and ``report.md``, with the NCCL
flight recorder's finding when the ranks left dumps in ``hang/nccl/``) and picks
the rank to blame.
"""

from __future__ import annotations

import base64
import binascii
import contextlib
import json
import time
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from corral.diagnose.hangs import (
    analyse_flight_recorder,
    group_stacks,
    hang_report,
    odd_ones_out,
    render_markdown,
)
from corral.private import write_private
from corral.recovery.hang import (
    HangDetector,
    HangVerdict,
    RankKey,
    classify,
    describe,
    top_frames,
)


class HangWatch:
    """Hang detection for one attempt (``timeout`` None: the auto mode)."""

    def __init__(self, timeout: float | None, directory: Path | None) -> None:
        self.detector = HangDetector.for_option(timeout, started=time.monotonic())
        self.directory = directory

    def observe(self, host: str, rank: int, step: Any) -> None:
        """A progress report arrived (reports without an integer step are ignored)."""
        if self.detector is None or isinstance(step, bool) or not isinstance(step, int):
            return
        self.detector.observe(host, rank, step, time.monotonic())

    def hold(self, now: float) -> None:
        """The job waits on corral itself: not a hang (see :meth:`HangDetector.hold`)."""
        if self.detector is not None:
            self.detector.hold(now)

    def check(self, now: float, ranks: Iterable[RankKey]) -> HangVerdict | None:
        """A verdict, once, when the live ``ranks`` stopped progressing."""
        return None if self.detector is None else self.detector.check(now, ranks)

    def write(self, stacks: Mapping[RankKey, str]) -> dict[RankKey, Path]:
        """Every rank's stack into ``<host>.<rank>.txt``; the paths written."""
        if self.directory is None:
            return {}
        paths: dict[RankKey, Path] = {}
        with contextlib.suppress(OSError):
            self.directory.mkdir(parents=True, exist_ok=True)
        for (host, rank), text in sorted(stacks.items()):
            path = self.directory / f"{host}.{rank}.txt"
            try:
                write_private(path, text if text.endswith("\n") else text + "\n")
            except OSError:
                continue
            paths[(host, rank)] = path
        return paths

    @staticmethod
    def describe(
        verdict: HangVerdict, stacks: Mapping[RankKey, str], paths: Mapping[RankKey, Path]
    ) -> list[str]:
        """The lines to print: who is stuck where, who waits, where the dumps are."""
        return describe(verdict, stacks, paths)

    def report(
        self,
        verdict: HangVerdict,
        stacks: Mapping[RankKey, str],
        paths: Mapping[RankKey, Path],
        traces: Mapping[int, str] | None = None,
    ) -> tuple[dict[str, Any], Path | None]:
        """The hang report (``report.json`` + ``report.md`` in the hang folder) and the
        path of its markdown (None when it could not be written). ``traces``: each
        rank's NCCL flight recorder dump (base64), analysed with torch's tooling."""
        flight, flight_error = None, None
        if traces and self.directory is not None:
            folder = self.directory / "nccl"
            with contextlib.suppress(OSError):
                folder.mkdir(parents=True, exist_ok=True)
            for rank, data in sorted(traces.items()):
                with contextlib.suppress(OSError, ValueError, binascii.Error):
                    (folder / f"rank_{rank}").write_bytes(base64.b64decode(data, validate=True))
            try:
                flight = analyse_flight_recorder(folder)
            except ValueError as exc:
                flight_error = str(exc)
        files = {key: str(path) for key, path in paths.items()}
        report = hang_report(
            verdict.message(), stacks, flight=flight, flight_error=flight_error, files=files
        )
        if self.directory is None:
            return report, None
        markdown = self.directory / "report.md"
        try:
            self.directory.mkdir(parents=True, exist_ok=True)
            write_private(self.directory / "report.json", json.dumps(report, indent=2) + "\n")
            write_private(markdown, render_markdown(report))
        except OSError:
            return report, None
        return report, markdown

    @staticmethod
    def culprit(verdict: HangVerdict, stacks: Mapping[RankKey, str]) -> RankKey | None:
        """The rank to blame: a suspect stuck outside a collective; else the odd one out
        (the rank not where the majority waits); else the first suspect."""
        stuck, _ = classify(stacks)
        for key in verdict.suspects:
            if key in stuck:
                return key
        if stuck:
            return stuck[0]
        _, odd = odd_ones_out(group_stacks(stacks))
        if odd:
            return odd[0].ranks[0]
        return verdict.suspects[0] if verdict.suspects else None

    @staticmethod
    def where(stacks: Mapping[RankKey, str], key: RankKey | None, n: int = 5) -> list[str]:
        """The top frames of ``key``'s stack (innermost first)."""
        if key is None or key not in stacks:
            return []
        return top_frames(stacks[key], n)
