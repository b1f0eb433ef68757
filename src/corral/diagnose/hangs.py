"""Hang forensics: which rank is not where the others are (pure but for torch's reader).

On a hang corral holds every rank's Python stack. :func:`group_stacks` groups the
ranks by where their main thread is (function, file and line of every frame);
:func:`odd_ones_out` names the ranks outside the majority's group: in a job where
every other rank waits in the same all-reduce, the one that is somewhere else (in
another collective, in its own code) is the one that never entered it.

On GPU jobs PyTorch's NCCL flight recorder saw every collective each rank issued.
:func:`analyse_flight_recorder` reads the per-rank dumps with torch's own tooling
(``torch.distributed.flight_recorder``, the library behind ``torchfrtrace``) and
names the first collective not every rank entered: its name, sequence number,
process group and the ranks missing from it.

:func:`hang_report` joins both into one JSON-able report and
:func:`render_markdown` writes it for people (``runs/<job>/hang/report.md``).
"""

from __future__ import annotations

import contextlib
import io
import logging
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
    "FlightFinding",
    "StackGroup",
    "analyse_flight_recorder",
    "group_stacks",
    "hang_report",
    "odd_ones_out",
    "render_markdown",
]

_SIGNATURE_FRAMES = 32  # innermost frames that make a rank's place


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


# -- the NCCL flight recorder ---------------------------------------------------------


@dataclass(frozen=True)
class FlightFinding:
    """The first collective not every rank of its group entered (flight recorder)."""

    collective: str
    sequence: int
    group: str
    state: str
    missing_ranks: list[int]
    expected_ranks: list[int]
    frames: list[str] = field(default_factory=list)

    def message(self) -> str:
        """``nccl:all_reduce #5 (group 0:default_pg): ranks 2 never entered it``."""
        who = ", ".join(str(r) for r in self.missing_ranks)
        noun = "rank" if len(self.missing_ranks) == 1 else "ranks"
        return (
            f"{self.collective} #{self.sequence} (group {self.group}, {self.state}): "
            f"{noun} {who} never entered it"
        )


def analyse_flight_recorder(directory: Path, prefix: str = "rank_") -> FlightFinding | None:
    """Read the per-rank flight recorder dumps ``<prefix><rank>`` in ``directory``
    with torch's analyser; the first collective some ranks never entered, or None
    (every collective matched). Raises ValueError when the dumps cannot be read
    (no torch, no files, a format this torch does not know)."""
    try:
        from torch.distributed.flight_recorder.components.builder import build_db
        from torch.distributed.flight_recorder.components.config_manager import JobConfig
        from torch.distributed.flight_recorder.components.loader import read_dir
    except ImportError as exc:
        raise ValueError(f"torch's flight recorder analyser is not available: {exc}") from None
    args = JobConfig().parse_args([str(directory), "--allow-incomplete-ranks", "--prefix", prefix])
    quiet = io.StringIO()
    logging.getLogger("Flight Recorder").setLevel(logging.ERROR)
    try:
        with contextlib.redirect_stdout(quiet), contextlib.redirect_stderr(quiet):
            details, version = read_dir(args)
            database = build_db(details, args, version)
    except (AssertionError, ValueError, KeyError, TypeError, OSError, EOFError) as exc:
        raise ValueError(
            f"cannot analyse the flight recorder dumps in {directory}: {exc}"
        ) from None
    except Exception as exc:  # unpickling errors and the like
        raise ValueError(
            f"cannot analyse the flight recorder dumps in {directory}: {exc}"
        ) from None
    for collective in database.collectives:
        missing = sorted(collective.missing_ranks or ())
        if missing or not collective.pass_check:
            return FlightFinding(
                collective=str(collective.collective_name),
                sequence=int(collective.collective_seq_id),
                group=str(collective.pg_desc),
                state=str(collective.collective_state),
                missing_ranks=missing,
                expected_ranks=sorted(collective.expected_ranks),
                frames=[
                    f"{f.get('name')} ({f.get('filename')}:{f.get('line')})"
                    for f in (collective.collective_frames or [])[:5]
                ],
            )
    return None


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
) -> dict[str, Any]:
    """The hang report as JSON-able data: the verdict's ``message``, the stack
    groups, the odd ones out (``odd``: one entry per rank, with its place and
    frames), the flight recorder's finding and the per-rank dump files. ``summary``
    is the one line that names the cause."""
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
    if flight is not None:
        summary = f"flight recorder: {flight.message()}"
    elif odd_ranks and majority is not None:
        names = ", ".join(_label(key) for group in odd for key in group.ranks[:8])
        summary = f"odd one out: {names} at {odd[0].where}; the others are at {majority.where}"
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
    flight = report.get("flight_recorder")
    if flight:
        lines += [
            "",
            "## NCCL flight recorder",
            "",
            f"- collective: `{flight['collective']}` #{flight['sequence']}"
            f" in group `{flight['group']}` ({flight['state']})",
            f"- never entered by ranks: {', '.join(str(r) for r in flight['missing_ranks'])}",
            f"- expected ranks: {', '.join(str(r) for r in flight['expected_ranks'])}",
        ]
        lines += [f"  - `{frame}`" for frame in flight.get("frames") or []]
    elif report.get("flight_recorder_error"):
        lines += ["", f"- flight recorder: {report['flight_recorder_error']}"]
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
