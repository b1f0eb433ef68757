"""The supervisor's side of hang detection: feed the detector, keep the dumps.

:mod:`corral.recovery.hang` decides (pure); this keeps its clock (the
coordinator's ``time.monotonic()`` when a report arrives), writes every rank's
stack to ``runs/<job>/hang/<host>.<rank>.txt`` and picks the rank to blame (the
hang report beside them is :mod:`corral.diagnose.hangreport`'s).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

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

    @staticmethod
    def culprit(
        verdict: HangVerdict, stacks: Mapping[RankKey, str], odd: Sequence[RankKey] = ()
    ) -> RankKey | None:
        """The rank to blame: a suspect stuck outside a collective; else the first of
        ``odd`` (the odd ones out: not where the majority waits); else the first suspect."""
        stuck, _ = classify(stacks)
        for key in verdict.suspects:
            if key in stuck:
                return key
        if stuck:
            return stuck[0]
        if odd:
            return odd[0]
        return verdict.suspects[0] if verdict.suspects else None

    @classmethod
    def blame(
        cls, verdict: HangVerdict, stacks: Mapping[RankKey, str], report: Mapping[str, Any]
    ) -> tuple[str | None, int | None, str, list[str], str]:
        """Whom the root cause of a hang names, from the stacks and the hang report:
        ``(host, rank, "; what the message adds", the frames to quote, their label)``.
        When every rank is at the same line, nobody: ``"; all N ranks at F (FILE:LINE)"``
        (host and rank None) with the stack they share."""
        odd = [(o["host"], o["rank"]) for o in report["odd"]]
        key = cls.culprit(verdict, stacks, odd)
        host, rank = key if key is not None else (None, None)
        where = cls.where(stacks, key)
        stuck = f"; rank {rank} on {host} is stuck in {where[0]}" if where else ""
        label = f"the stack of rank {rank} on {host}, innermost frame first"
        groups = report["groups"]
        if report["flight_recorder"] or (report["odd"] and report["odd"][0]["waiting"]):
            stuck = f"; {report['summary']}"  # the odd one out waits elsewhere
        elif len(groups) == 1 and len(stacks) > 1 and not report["no_stack"]:
            shared = list(groups[0]["frames"])
            at = shared[0] if shared else groups[0]["where"]
            return (
                None,
                None,
                f"; all {len(stacks)} ranks at {at}",
                shared,
                ("the stack every rank shares, innermost frame first"),
            )
        return host, rank, stuck, where, label

    @staticmethod
    def where(stacks: Mapping[RankKey, str], key: RankKey | None, n: int = 5) -> list[str]:
        """The top frames of ``key``'s stack (innermost first)."""
        if key is None or key not in stacks:
            return []
        return top_frames(stacks[key], n)
