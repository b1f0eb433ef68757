"""Hang forensics: which rank is not where the others are (pure but for torch's reader).

On a hang corral holds every rank's Python stack. :func:`group_stacks` groups the
ranks by where their main thread is (function, file and line of every frame);
:func:`odd_ones_out` names the ranks outside the majority's group: in a job where
every other rank waits in the same all-reduce, the one that is somewhere else (in
another collective, in its own code) is the one that never entered it.

PyTorch's flight recorder (NCCL's, and gloo's in recent torch) saw every
collective each rank issued. :func:`read_flight_recorder` reads the per-rank dumps
with torch's own tooling (``torch.distributed.flight_recorder``, the library
behind ``torchfrtrace``) and names the first collective not every rank entered:
its name, sequence number, process group, the ranks missing from it and the ones
that were in another collective instead; and it keeps each rank's last
collectives, which the report shows even when every collective matched.

:func:`hang_report` joins both into one JSON-able report and
:func:`render_markdown` writes it for people (``runs/<job>/hang/report.md``).
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from corral.recovery.hang import (
    Frame,
    RankKey,
    collective_site,
    parse_stack,
    waits_in_collective,
)

__all__ = [
    "LAST_COLLECTIVES",
    "FlightFinding",
    "StackGroup",
    "analyse_flight_recorder",
    "group_stacks",
    "hang_report",
    "odd_ones_out",
    "read_flight_recorder",
    "render_markdown",
]

_SIGNATURE_FRAMES = 32  # innermost frames that make a rank's place
#: How many of each rank's last flight recorder entries the report shows.
LAST_COLLECTIVES = 5
_ANALYSIS_TIMEOUT = 120.0  # seconds torch's analyser may take over the dumps


@dataclass(frozen=True)
class StackGroup:
    """Ranks whose main threads are at the same place: ``where`` (the collective
    site, or the innermost frames), ``frames`` (innermost first), ``waiting`` when
    the place is collective machinery."""

    ranks: list[RankKey]
    where: str
    frames: list[str]
    waiting: bool


def _signature(frames: Sequence[Frame]) -> tuple[tuple[str, str, int | None], ...]:
    return tuple((f.function, f.short_file(), f.line) for f in frames[:_SIGNATURE_FRAMES])


def _place(frames: Sequence[Frame]) -> str:
    if waits_in_collective(frames):
        return collective_site(frames)
    return " <- ".join(str(frame) for frame in frames[:3])


def group_stacks(stacks: Mapping[RankKey, str]) -> list[StackGroup]:
    """The ranks grouped by their main thread's frames, largest group first (ties in
    rank order); ranks whose dump has no frames are left out."""
    groups: dict[tuple[tuple[str, str, int | None], ...], list[RankKey]] = {}
    frames_of: dict[tuple[tuple[str, str, int | None], ...], list[Frame]] = {}
    for key in sorted(stacks, key=lambda k: (k[1], k[0])):
        frames = parse_stack(stacks[key])
        if not frames:
            continue
        signature = _signature(frames)
        groups.setdefault(signature, []).append(key)
        frames_of.setdefault(signature, frames)
    found = [
        StackGroup(
            ranks=keys,
            where=_place(frames_of[sig]),
            frames=[str(frame) for frame in frames_of[sig][:5]],
            waiting=waits_in_collective(frames_of[sig]),
        )
        for sig, keys in groups.items()
    ]
    return sorted(found, key=lambda g: (-len(g.ranks), g.ranks[0][1]))


def odd_ones_out(groups: Sequence[StackGroup]) -> tuple[StackGroup | None, list[StackGroup]]:
    """(the majority's group, the groups of the odd ones out).

    The majority is the one largest group. Without one (a tie), when some groups
    wait in a collective and others do not, the waiting ones are the majority and
    the others odd; else nobody is named (``(None, [])``). With one group only,
    every rank is at the same place: no odd one out."""
    if len(groups) < 2:
        return (groups[0] if groups else None), []
    if len(groups[0].ranks) > len(groups[1].ranks):
        return groups[0], list(groups[1:])
    waiting = [g for g in groups if g.waiting]
    stuck = [g for g in groups if not g.waiting]
    if waiting and stuck:
        biggest = max(waiting, key=lambda g: len(g.ranks))
        return biggest, [g for g in groups if g is not biggest]
    return None, []


# -- the flight recorder ---------------------------------------------------------------


@dataclass(frozen=True)
class FlightFinding:
    """The first collective not every rank of its group entered (flight recorder):
    ``missing_ranks`` never entered it, ``mismatched`` ranks were in another
    collective at that sequence number (``{"rank", "collective"}``)."""

    collective: str
    sequence: int
    group: str
    state: str
    missing_ranks: list[int]
    expected_ranks: list[int]
    frames: list[str] = field(default_factory=list)
    mismatched: list[dict[str, Any]] = field(default_factory=list)

    def message(self) -> str:
        """``gloo:all_reduce #5 (group 0:default_pg, scheduled): rank 2 never entered it``."""
        head = f"{self.collective} #{self.sequence} (group {self.group}, {self.state}): "
        if self.missing_ranks:
            who = ", ".join(str(r) for r in self.missing_ranks)
            noun = "rank" if len(self.missing_ranks) == 1 else "ranks"
            return f"{head}{noun} {who} never entered it"
        if self.mismatched:
            return head + "; ".join(
                f"rank {m['rank']} was in {m['collective']} #{self.sequence} instead"
                for m in self.mismatched
            )
        return f"{head}not the same on every rank"


def read_flight_recorder(
    directory: Path, prefix: str = "rank_", last: int = LAST_COLLECTIVES
) -> tuple[FlightFinding | None, dict[int, list[dict[str, Any]]]]:
    """Read the per-rank flight recorder dumps ``<prefix><rank>`` in ``directory`` with
    torch's analyser (:mod:`corral.diagnose.frtrace`, in its own process): (the first
    collective some ranks never entered or entered differently, None when every
    collective matched; each rank's ``last`` entries, oldest first). Raises
    ValueError when the dumps cannot be read (no torch, no files, a format this
    torch does not know)."""
    try:
        done = subprocess.run(
            [sys.executable, "-m", "corral.diagnose.frtrace", str(directory), prefix, str(last)],
            capture_output=True,
            text=True,
            timeout=_ANALYSIS_TIMEOUT,
            stdin=subprocess.DEVNULL,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise ValueError(f"cannot run torch's flight recorder analyser: {exc}") from None
    try:
        result = json.loads(done.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        tail = (done.stderr.strip().splitlines() or [f"exit code {done.returncode}"])[-1]
        raise ValueError(f"torch's flight recorder analyser failed: {tail}") from None
    if result.get("error"):
        raise ValueError(str(result["error"]))
    recent = {int(rank): list(rows) for rank, rows in (result.get("last") or {}).items()}
    found = result.get("finding")
    if not found:
        return None, recent
    return FlightFinding(
        collective=str(found["collective"]),
        sequence=int(found["sequence"]),
        group=str(found["group"]),
        state=str(found["state"]),
        missing_ranks=[int(r) for r in found["missing_ranks"]],
        expected_ranks=[int(r) for r in found["expected_ranks"]],
        frames=[str(f) for f in found.get("frames") or []],
        mismatched=list(found.get("mismatched") or []),
    ), recent


def analyse_flight_recorder(directory: Path, prefix: str = "rank_") -> FlightFinding | None:
    """The finding of :func:`read_flight_recorder` alone."""
    return read_flight_recorder(directory, prefix)[0]


# -- the report -----------------------------------------------------------------------


def _label(key: RankKey) -> str:
    return f"rank {key[1]} on {key[0]}"


def hang_report(
    message: str,
    stacks: Mapping[RankKey, str],
    *,
    flight: FlightFinding | None = None,
    flight_error: str | None = None,
    files: Mapping[RankKey, str] | None = None,
    last_collectives: Mapping[int, list[dict[str, Any]]] | None = None,
    flight_missing: Mapping[int, str] | None = None,
) -> dict[str, Any]:
    """The hang report as JSON-able data: the verdict's ``message``, the stack
    groups, the odd ones out (``odd``: one entry per rank, with its place and
    frames), the flight recorder's finding (or ``flight_recorder_error``: why there
    is none), each rank's last collectives, why some ranks gave no dump, and the
    per-rank dump files. ``summary`` is the one line that names the cause."""
    groups = group_stacks(stacks)
    majority, odd = odd_ones_out(groups)
    odd_ranks = [
        {
            "host": key[0],
            "rank": key[1],
            "where": group.where,
            "frames": group.frames,
            "waiting": group.waiting,
        }
        for group in odd
        for key in group.ranks
    ]
    missing = [key for key in stacks if not parse_stack(stacks[key])]
    odd_line = ""
    if odd_ranks and majority is not None:
        names = ", ".join(_label(key) for group in odd for key in group.ranks[:8])
        odd_line = f"odd one out: {names} at {odd[0].where}; the others are at {majority.where}"
    if flight is not None:
        summary = f"flight recorder: {flight.message()}" + (f"; {odd_line}" if odd_line else "")
    elif odd_line:
        summary = odd_line
    elif len(groups) == 1 and not missing:
        summary = f"every rank is at {groups[0].where}"
    else:
        summary = "the ranks' stacks differ with no majority"
    return {
        "message": message,
        "summary": summary,
        "groups": [
            {
                "ranks": [{"host": h, "rank": r} for h, r in group.ranks],
                "where": group.where,
                "frames": group.frames,
                "waiting": group.waiting,
            }
            for group in groups
        ],
        "odd": odd_ranks,
        "no_stack": [{"host": h, "rank": r} for h, r in missing],
        "flight_recorder": None if flight is None else asdict(flight),
        "flight_recorder_error": flight_error,
        "last_collectives": [
            {"rank": rank, "entries": entries}
            for rank, entries in sorted((last_collectives or {}).items())
        ],
        "flight_recorder_missing": [
            {"rank": rank, "why": why} for rank, why in sorted((flight_missing or {}).items())
        ],
        "files": {f"{h}.{r}": path for (h, r), path in sorted((files or {}).items())},
    }


def render_markdown(report: Mapping[str, Any]) -> str:
    """The report for people: summary, odd ones out, every group, the flight recorder."""
    lines = [
        "# Hang report",
        "",
        f"**{report['summary']}**",
        "",
        f"- detected: {report['message']}",
    ]
    for odd in report.get("odd") or []:
        lines.append(f"- odd one out: rank {odd['rank']} on {odd['host']} at `{odd['where']}`")
    lines += _flight_lines(report)
    lines += ["", "## Where each rank is", ""]
    for group in report.get("groups") or []:
        names = ", ".join(f"rank {r['rank']} on {r['host']}" for r in group["ranks"])
        kind = "waiting in a collective" if group["waiting"] else "in its own code"
        lines.append(f"### {names} ({kind})")
        lines.append("")
        lines += [f"    {frame}" for frame in group["frames"]]
        lines.append("")
    if report.get("no_stack"):
        names = ", ".join(f"rank {r['rank']} on {r['host']}" for r in report["no_stack"])
        lines += [f"No stack from {names}.", ""]
    if report.get("files"):
        lines += ["## Stack dumps", ""]
        lines += [f"- {name}: {path}" for name, path in report["files"].items()]
    return "\n".join(lines).rstrip() + "\n"


def _sizes(sizes: Sequence[Any]) -> str:
    return ", ".join("x".join(str(d) for d in size) or "scalar" for size in sizes) or "-"


def _flight_lines(report: Mapping[str, Any]) -> list[str]:
    """The report's flight recorder section: the finding (or why there is none), each
    rank's last collectives, the ranks without a dump."""
    lines = ["", "## Flight recorder", ""]
    flight = report.get("flight_recorder")
    if flight:
        lines.append(
            f"- collective: `{flight['collective']}` #{flight['sequence']}"
            f" in group `{flight['group']}` ({flight['state']})"
        )
        if flight["missing_ranks"]:
            lines.append(
                f"- never entered by ranks: {', '.join(str(r) for r in flight['missing_ranks'])}"
            )
        for other in flight.get("mismatched") or []:
            lines.append(f"- rank {other['rank']} was in `{other['collective']}` instead")
        lines.append(f"- expected ranks: {', '.join(str(r) for r in flight['expected_ranks'])}")
        lines += [f"  - `{frame}`" for frame in flight.get("frames") or []]
    elif report.get("flight_recorder_error"):
        lines.append(f"- no finding: {report['flight_recorder_error']}")
    elif report.get("last_collectives"):
        lines.append("- every recorded collective was entered by every rank of its group")
    last = report.get("last_collectives") or []
    if last:
        lines += [
            "",
            "Each rank's last collectives (oldest first):",
            "",
            "| rank | seq | op | state | input sizes | output sizes | group |",
            "|---|---|---|---|---|---|---|",
        ]
        for rank in last:
            for entry in rank["entries"]:
                seq = "" if entry["seq"] is None else entry["seq"]
                kind = " (p2p)" if entry.get("p2p") else ""
                lines.append(
                    f"| {rank['rank']} | {seq}{kind} | `{entry['op']}` | {entry['state']}"
                    f" | {_sizes(entry['input_sizes'])} | {_sizes(entry['output_sizes'])}"
                    f" | `{entry['group']}` |"
                )
    for gap in report.get("flight_recorder_missing") or []:
        lines.append(f"- no dump from rank {gap['rank']}: {gap['why']}")
    return lines
