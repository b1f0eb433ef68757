"""Hang detection: who stopped making progress, and where it is stuck (pure, no I/O).

Two parts, both plain data in and out, so the supervisor decides the clock and
does the I/O:

* :class:`HangDetector` turns progress reports (``sdk.report(step)``) into a
  :class:`HangVerdict`: the whole job *stalled*, or some ranks *lagging*
  behind the others.
* :func:`parse_stack`, :func:`top_frames`, :func:`classify` and
  :func:`describe` read the stack dumps taken afterwards (``py-spy dump`` or
  the faulthandler dump the SDK registers) and say which rank is stuck in its
  own code and which ones merely wait for it in a collective.

Progress means the reported step *changed* (normally: increased; a counter that
restarts every epoch also counts). Repeating the same step is not progress, so a
heartbeat thread that keeps reporting the last step cannot hide a hang.

Use one clock for ``observe`` and ``check`` (the coordinator's
``time.monotonic()`` when a report arrives is the natural one: the ranks' own
clocks may disagree).
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal

__all__ = [
    "AUTO_HANG_TIMEOUT",
    "Frame",
    "HangDetector",
    "HangVerdict",
    "RankKey",
    "ThreadStack",
    "classify",
    "collective_site",
    "describe",
    "main_thread",
    "parse_stack",
    "parse_threads",
    "top_frames",
    "waits_in_collective",
]

#: The timeout used when hang detection is on without ``--hang-timeout``; it is
#: armed only once some rank reported progress (see :meth:`HangDetector.for_option`).
AUTO_HANG_TIMEOUT = 300.0

RankKey = tuple[str, int]  # (host, global rank)
HangKind = Literal["stalled", "lagging"]

_MAX_NAMED = 8  # ranks named in one line of describe() before "and N more"


# -- detection ------------------------------------------------------------------------


def _label(key: RankKey) -> str:
    return f"rank {key[1]} on {key[0]}"


def _names(keys: Sequence[RankKey]) -> str:
    shown = [_label(key) for key in keys[:_MAX_NAMED]]
    if len(keys) > _MAX_NAMED:
        shown.append(f"{len(keys) - _MAX_NAMED} more")
    if len(shown) == 1:
        return shown[0]
    return ", ".join(shown[:-1]) + " and " + shown[-1]


def _step_range(steps: Iterable[int]) -> str:
    values = sorted(set(steps))
    if len(values) == 1:
        return f"step {values[0]}"
    return f"steps {values[0]}-{values[-1]}"


@dataclass
class HangVerdict:
    """What the detector found.

    ``kind`` is ``"stalled"`` (no rank progressed for ``seconds``) or
    ``"lagging"`` (the ``suspects`` made no progress for ``seconds`` while the
    others kept going). ``steps`` holds the last reported step of every rank
    considered (None: never reported).
    """

    kind: HangKind
    suspects: list[RankKey]
    seconds: float
    steps: dict[RankKey, int | None] = field(default_factory=dict)

    def message(self) -> str:
        """One line for the user, e.g. ``no rank made progress for 30 s (all at step 12)``."""
        secs = f"{self.seconds:.0f} s"
        reported = {key: step for key, step in self.steps.items() if step is not None}
        if self.kind == "lagging":
            others = [step for key, step in reported.items() if key not in self.suspects]
            tail = f"others at {_step_range(others)}" if others else "others moving"
            if len(self.suspects) == 1:
                key = self.suspects[0]
                step = self.steps.get(key)
                at = f"step {step}; " if step is not None else ""
                return f"{_label(key)} made no progress for {secs} ({at}{tail})"
            who = _names(self.suspects)
            mine = [s for key in self.suspects if (s := self.steps.get(key)) is not None]
            at = f"at {_step_range(mine)}; " if mine else ""
            return f"{who} made no progress for {secs} ({at}{tail})"
        if not reported:
            return (
                f"no rank reported progress in {secs} since the start"
                " (does the script call sdk.report()?)"
            )
        if len(reported) < len(self.steps):
            where = f"the reporting ranks at {_step_range(reported.values())}"
            behind = [key for key in self.suspects if key in reported]
            if behind and len(behind) < len(reported):  # the lowest of those who reported
                where += f"; behind: {_names(behind)}"
        elif len(set(reported.values())) == 1:
            where = f"all at {_step_range(reported.values())}"
        else:
            where = f"{_step_range(reported.values())}; behind: {_names(self.suspects)}"
        return f"no rank made progress for {secs} ({where})"


class HangDetector:
    """Watches progress reports and says once when the job hangs.

    Rules, checked by :meth:`check` over the live ranks it is given:

    * **stalled**: no rank made progress for ``timeout`` seconds. The suspects
      are the reporting ranks with the lowest step (every rank when none has
      reported); with all ranks at the same step the stacks tell who is stuck.
    * **lagging**: a rank that has reported before made no progress for more
      than ``timeout`` seconds longer than the most recent progress of the
      other reporting ranks, which are still moving. The suspects are all such
      ranks. A rank that never reported is never "lagging" (scripts often
      report from rank 0 only); it only counts towards "stalled".

    A rank that has not reported yet counts as having progressed at
    ``started`` (the constructor or :meth:`start`), or, with
    ``wait_for_first_report``, at the first report of any rank: in that mode
    nothing fires before some rank has reported, so a script that never calls
    ``sdk.report()`` is never flagged and a long start-up (imports, data
    loading, rendezvous) is not a hang.

    The verdict fires once: after :meth:`check` returned one it returns None
    until :meth:`start` begins a new attempt.
    """

    def __init__(
        self, timeout: float, *, started: float = 0.0, wait_for_first_report: bool = False
    ) -> None:
        if timeout <= 0:
            raise ValueError(f"hang timeout must be > 0, got {timeout}")
        self.timeout = float(timeout)
        self.wait_for_first_report = wait_for_first_report
        self._started = started
        self._first_report: float | None = None
        self._last: dict[RankKey, tuple[int, float]] = {}  # key -> (step, time it changed)
        self._verdict: HangVerdict | None = None

    @classmethod
    def for_option(cls, hang_timeout: float | None, *, started: float = 0.0) -> HangDetector | None:
        """The detector for ``--hang-timeout``: None means *auto*, ``<= 0`` means off.

        * ``hang_timeout > 0``: that timeout, armed once some rank has reported
          progress (``wait_for_first_report=True``): start-up (imports, data
          loading, rendezvous) can take longer than a step ever should, and is
          bounded by ``--rdzv-timeout`` instead.
        * ``None`` (not given): :data:`AUTO_HANG_TIMEOUT`, armed the same way.
        * ``hang_timeout <= 0``: disabled, returns None.
        """
        if hang_timeout is None:
            return cls(AUTO_HANG_TIMEOUT, started=started, wait_for_first_report=True)
        if hang_timeout <= 0:
            return None
        return cls(hang_timeout, started=started, wait_for_first_report=True)

    @property
    def verdict(self) -> HangVerdict | None:
        """The verdict that already fired in this attempt, if any."""
        return self._verdict

    @property
    def armed(self) -> bool:
        """Whether :meth:`check` can fire at all yet."""
        return not self.wait_for_first_report or self._first_report is not None

    def start(self, when: float) -> None:
        """Begin a new attempt at ``when``: forget all progress and any verdict."""
        self._started = when
        self._first_report = None
        self._last.clear()
        self._verdict = None

    def observe(self, host: str, rank: int, step: int, when: float) -> None:
        """Record that ``rank`` on ``host`` reported ``step`` at ``when``."""
        key = (host, rank)
        if self._first_report is None:
            self._first_report = when
        last = self._last.get(key)
        if last is None or last[0] != step:
            self._last[key] = (step, when)

    def hold(self, when: float) -> None:
        """corral itself holds the job up at ``when`` (rank 0's save waits for the
        coordinator's checkpoint copy, so every rank soon waits on it): count that as
        progress of every rank, so the wait is never taken for a hang."""
        if not self.armed:
            return
        self._last = {key: (step, max(seen, when)) for key, (step, seen) in self._last.items()}
        if self._first_report is not None:
            self._first_report = max(self._first_report, when)
        self._started = max(self._started, when)

    def forget(self, host: str, rank: int) -> None:
        """Drop what is known about one rank (it exited, or was restarted)."""
        self._last.pop((host, rank), None)

    def check(self, now: float, ranks: Iterable[RankKey]) -> HangVerdict | None:
        """The verdict at ``now`` over the live ``ranks``, or None; fires once."""
        if self._verdict is not None or not self.armed:
            return None
        keys = list(dict.fromkeys(ranks))
        if not keys:
            return None
        baseline = self._first_report if self.wait_for_first_report else self._started
        assert baseline is not None
        progress: dict[RankKey, float] = {}
        steps: dict[RankKey, int | None] = {}
        for key in keys:
            last = self._last.get(key)
            steps[key] = None if last is None else last[0]
            progress[key] = baseline if last is None else last[1]
        reporters = [key for key in keys if steps[key] is not None]
        newest = max(progress.values())
        verdict: HangVerdict | None = None
        if now - newest >= self.timeout:
            if reporters:
                low = min(step for key in reporters if (step := steps[key]) is not None)
                suspects = [key for key in reporters if steps[key] == low]
            else:
                suspects = keys
            verdict = HangVerdict("stalled", suspects, now - newest, steps)
        else:
            # The newest progress of the *other* reporters: the newest overall, or the
            # runner-up for the rank that holds it.
            ranked = sorted(reporters, key=lambda key: progress[key], reverse=True)
            order = {key: i for i, key in enumerate(keys)}
            suspects = sorted(
                (key for key in ranked[1:] if progress[ranked[0]] - progress[key] > self.timeout),
                key=order.__getitem__,
            )
            if suspects:
                seconds = now - min(progress[key] for key in suspects)
                verdict = HangVerdict("lagging", suspects, seconds, steps)
        self._verdict = verdict
        return verdict


# -- stacks ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Frame:
    """One Python frame of a stack dump (``line`` None where the dump had none)."""

    function: str
    file: str
    line: int | None

    def short_file(self) -> str:
        """The file as py-spy shows it: ``torch/distributed/x.py``, ``train.py``."""
        path = self.file.replace("\\", "/")
        if not os.path.isabs(path) and not re.match(r"^[A-Za-z]:/", path):
            return path
        for marker in ("/site-packages/", "/dist-packages/"):
            if marker in path:
                return path.rsplit(marker, 1)[1]
        stdlib = re.search(r"/lib/python\d+(?:\.\d+)?t?/", path)
        if stdlib:
            return path[stdlib.end() :]
        return path.rsplit("/", 1)[-1]

    def __str__(self) -> str:
        where = self.short_file() if self.line is None else f"{self.short_file()}:{self.line}"
        return f"{self.function} ({where})"


@dataclass
class ThreadStack:
    """One thread of a dump: its id, name (py-spy only) and frames, innermost first."""

    ident: str
    name: str | None = None
    current: bool = False  # faulthandler's "Current thread" (the one that took the signal)
    frames: list[Frame] = field(default_factory=list)


_PYSPY_THREAD = re.compile(
    r'^Thread (?P<ident>0x[0-9A-Fa-f]+|\d+) \((?P<state>[^)]*)\)(?::\s*"(?P<name>.*)")?\s*$'
)
_PYSPY_FRAME = re.compile(r"^\s+(?P<func>\S.*?) \((?P<file>.+?)(?::(?P<line>\d+))?\)\s*$")
_FH_THREAD = re.compile(
    r"^(?:(?P<current>Current thread)|Thread|Stack)\s*(?P<ident>0x[0-9A-Fa-f]+)?.*"
    r"\(most recent call first\):\s*$"
)
_FH_FRAME = re.compile(r'^\s+File "(?P<file>.*)", line (?P<line>\d+|\?+) in (?P<func>.+?)\s*$')


def parse_threads(text: str) -> list[ThreadStack]:
    """Every thread of a ``py-spy dump`` or faulthandler dump, frames innermost first.

    When ``text`` holds several dumps (a stack file appended to more than once)
    only the last one is returned. Lines of neither format are ignored.
    """
    dumps: list[list[ThreadStack]] = [[]]
    current: ThreadStack | None = None
    for raw in text.splitlines():
        if raw.startswith("Process ") and dumps[-1]:
            dumps.append([])  # py-spy's header starts each dump
            current = None
            continue
        match = _PYSPY_THREAD.match(raw)
        if match:
            current = ThreadStack(ident=match["ident"], name=match["name"])
            dumps[-1].append(current)
            continue
        match = _FH_THREAD.match(raw)
        if match:
            ident = match["ident"] or ""
            if ident and any(thread.ident == ident for thread in dumps[-1]):
                dumps.append([])  # the same thread again: a later dump
            current = ThreadStack(ident=ident, current=match["current"] is not None)
            dumps[-1].append(current)
            continue
        if current is None:
            continue
        match = _FH_FRAME.match(raw)
        if match:
            line = match["line"]
            current.frames.append(
                Frame(match["func"], match["file"], int(line) if line.isdigit() else None)
            )
            continue
        match = _PYSPY_FRAME.match(raw)
        if match:
            line = match["line"]
            current.frames.append(Frame(match["func"], match["file"], int(line) if line else None))
    return next((dump for dump in reversed(dumps) if dump), [])


def _is_thread_bootstrap(frame: Frame) -> bool:
    return frame.short_file().endswith("threading.py") and frame.function.endswith("_bootstrap")


def main_thread(threads: Sequence[ThreadStack]) -> ThreadStack | None:
    """The main thread: py-spy's ``MainThread``; else the last thread not started by
    :mod:`threading` (faulthandler lists the main thread last); else the current one."""
    for thread in threads:
        if thread.name == "MainThread":
            return thread
    candidates = [t for t in threads if t.frames and not _is_thread_bootstrap(t.frames[-1])]
    if candidates:
        return candidates[-1]
    for thread in threads:
        if thread.current:
            return thread
    return threads[0] if threads else None


def parse_stack(text: str) -> list[Frame]:
    """The main thread's frames, innermost first (empty when ``text`` has none)."""
    thread = main_thread(parse_threads(text))
    return list(thread.frames) if thread is not None else []


def top_frames(text: str, n: int = 3) -> list[str]:
    """The ``n`` innermost frames of the main thread, e.g. ``["step (train.py:13)", ...]``."""
    return [str(frame) for frame in parse_stack(text)[:n]]


# Where a rank waits for the others rather than being stuck itself (torchft's: its
# Manager waiting for a quorum, healing, or its process group).
_COLLECTIVE_PATHS = (
    "torch/distributed/",
    "torch/nn/parallel/",
    "torch/autograd/",
    "torch/cuda/",
    "deepspeed/comm/",
    "torchft/",
)
_COLLECTIVE_FUNCTIONS = frozenset(
    {
        "all_gather",
        "all_gather_into_tensor",
        "all_gather_object",
        "all_reduce",
        "all_reduce_coalesced",
        "all_to_all",
        "all_to_all_single",
        "barrier",
        "broadcast",
        "broadcast_object_list",
        "monitored_barrier",
        "reduce_scatter",
        "reduce_scatter_tensor",
        "_engine_run_backward",
        "run_backward",
    }
)
_LIBRARY_WAIT_FUNCTIONS = frozenset({"wait", "synchronize", "backward", "recv", "send"})
# Standard-library waiting frames that sit on top of whoever waits.
_GENERIC_WAIT_FILES = ("threading.py", "queue.py", "selectors.py", "concurrent/futures/_base.py")


def _is_library(frame: Frame) -> bool:
    path = frame.file.replace("\\", "/")
    return (
        "/site-packages/" in path
        or "/dist-packages/" in path
        or path.startswith("torch/")
        or "/torch/" in path
    )


def _is_collective(frame: Frame) -> bool:
    path = frame.file.replace("\\", "/")
    if any(part in path for part in _COLLECTIVE_PATHS):
        return True
    if path.endswith("torch/_tensor.py") and frame.function.endswith("backward"):
        return True
    name = frame.function.rsplit(".", 1)[-1]
    if name in _COLLECTIVE_FUNCTIONS:
        return True
    return name in _LIBRARY_WAIT_FUNCTIONS and _is_library(frame)


def waits_in_collective(frames: Sequence[Frame]) -> bool:
    """Whether the innermost frame (under any standard-library wait) is collective machinery."""
    for frame in frames:
        if frame.short_file().endswith(_GENERIC_WAIT_FILES):
            continue
        return _is_collective(frame)
    return False


def _is_user(frame: Frame) -> bool:
    return not (
        _is_library(frame)
        or _is_collective(frame)
        or frame.file.startswith("<")
        or frame.short_file().endswith(_GENERIC_WAIT_FILES)
    )


def collective_site(frames: Sequence[Frame]) -> str:
    """Where a waiting rank waits: ``all_reduce (torch/...:3252) from step (train.py:15)``."""
    if not frames:
        return ""
    caller = next((frame for frame in frames[1:] if _is_user(frame)), None)
    return f"{frames[0]} from {caller}" if caller is not None else str(frames[0])


def classify(
    stacks: Mapping[RankKey, str],
) -> tuple[list[RankKey], list[RankKey]]:
    """Split ranks into (stuck, waiting) by their main thread's innermost frames.

    *waiting*: inside torch's distributed / autograd / collective machinery
    (``all_reduce``, ``barrier``, ``Work.wait``, ``_engine_run_backward``...),
    i.e. waiting for some other rank. *stuck*: anywhere else, such as the
    user's own function at a ``time.sleep`` line (py-spy shows no C frames, so
    the innermost frame is the Python caller). Ranks whose dump has no frames
    are in neither list. Order follows ``stacks``.
    """
    stuck: list[RankKey] = []
    waiting: list[RankKey] = []
    for key, text in stacks.items():
        frames = parse_stack(text)
        if not frames:
            continue
        (waiting if waits_in_collective(frames) else stuck).append(key)
    return stuck, waiting


def _group_by_where(
    keys: Sequence[RankKey], stacks: Mapping[RankKey, str], n: int | None
) -> list[tuple[str, list[RankKey]]]:
    """Ranks grouped by place: their top ``n`` frames, or (None) their collective site."""
    groups: dict[str, list[RankKey]] = {}
    for key in keys:
        if n is None:
            where = collective_site(parse_stack(stacks[key]))
        else:
            where = " <- ".join(top_frames(stacks[key], n))
        groups.setdefault(where, []).append(key)
    return list(groups.items())


def _rank_order(verdict: HangVerdict, keys: Iterable[RankKey]) -> list[RankKey]:
    suspects = {key: i for i, key in enumerate(verdict.suspects)}
    return sorted(keys, key=lambda key: (key not in suspects, suspects.get(key, 0)))


def describe(
    verdict: HangVerdict,
    stacks: Mapping[RankKey, str],
    paths: Mapping[RankKey, str | os.PathLike[str]] | None = None,
    *,
    frames: int = 3,
) -> list[str]:
    """The lines corral prints for a hang.

    The verdict's message; then which ranks are stuck and where (their top
    ``frames`` frames, innermost first, joined by ``<-``), grouped by place,
    suspects first; which ranks wait in a collective and at what; which ranks
    gave no stack; and where the dumps were written (``paths``: one file per
    rank).
    """
    lines = [f"hang: {verdict.message()}"]
    stuck, waiting = classify(stacks)
    for where, keys in _group_by_where(_rank_order(verdict, stuck), stacks, frames):
        verb = "is" if len(keys) == 1 else "are"
        lines.append(f"{_names(keys)} {verb} stuck in {where}")
    for where, keys in _group_by_where(_rank_order(verdict, waiting), stacks, None):
        verb = "waits" if len(keys) == 1 else "wait"
        lines.append(f"{_names(keys)} {verb} in a collective at {where}")
    if waiting and not stuck:
        lines.append("every rank with a stack waits in a collective (mismatched collectives?)")
    missing = [key for key in verdict.steps if not parse_stack(stacks.get(key, ""))]
    missing = _rank_order(verdict, missing)
    if missing:
        lines.append(f"no stack from {_names(missing)}")
    if paths:
        files = [os.fspath(path) for path in paths.values()]
        folders = {os.path.dirname(path) for path in files}
        if len(folders) == 1:
            lines.append(f"stack dumps: {folders.pop() or '.'}{os.sep} ({len(files)} files)")
        else:
            lines.append(f"stack dumps: {', '.join(files)}")
        for key in _rank_order(verdict, stuck)[:_MAX_NAMED]:
            if key in paths:
                lines.append(f"  {_label(key)}: {os.fspath(paths[key])}")
    return lines
