"""The launchers' teardown noise, folded the same way in every log view.

Once corral stops a job (or every rank of a node has exited), what a launcher
prints about its own end is noise: torchrun's ``SignalException: Process N got
signal: 15`` traceback on SIGTERM, its ``TCPStore recvVector failed`` stack after
a success. :class:`TeardownFold` decides, from a job's events in order, which
node-level lines (``rank`` -1) are that noise; every view (``corral run``'s live
output, ``corral logs``, ``corral job logs``, the API's output pages and the web's
event stream) hides them and shows one :func:`fold_note` per node instead. The
log files keep every line; where each node's teardown began in its
``<host>.node.log`` is recorded in ``logs/attempts.jsonl`` (:func:`teardown_marker`)
so that ``corral logs`` folds the same lines after the fact.
"""

from __future__ import annotations

import json
from collections.abc import Callable

from corral.job.events import AttemptStarted, JobEvent, LogLines, RankExited, StateChanged
from corral.job.logfiles import ATTEMPT_INDEX, NODE_RANK_LABEL, LogFiles
from corral.job.states import JobState
from corral.private import append_private
from corral.words import plural


def fold_note(host: str, count: int) -> str:
    """The one line that stands for a node's folded teardown output."""
    return f"{host}: the launcher's teardown output ({plural(count, 'line')}) is in {host}.node.log"


class TeardownFold:
    """Which node-level lines of a job are its launcher's teardown output.

    Feed every event in order to :meth:`see`; it answers True for a
    :class:`~corral.job.events.LogLines` chunk to hide (and counts its lines).
    :meth:`flush` hands back the notes of what was hidden, once the teardown is over
    (``ended`` turns True at a restart, a success or a final state).
    ``on_begin(host)`` is called once per host and attempt when its teardown begins."""

    def __init__(self, on_begin: Callable[[str], None] | None = None) -> None:
        self.stopping = False
        self.ranks_done: set[str] = set()
        self.counts: dict[str, int] = {}
        self.ended = False
        self._begun: set[str] = set()
        self._hosts: list[str] = []
        self._on_begin = on_begin

    def tearing(self, host: str) -> bool:
        """Whether ``host``'s node-level output is teardown noise from now on."""
        return self.stopping or host in self.ranks_done

    def see(self, event: JobEvent | None) -> bool:
        """Take ``event`` into account (None: one the fold has no use for); True for a
        log chunk to hide."""
        if isinstance(event, LogLines):
            if event.rank == NODE_RANK_LABEL and self.tearing(event.host):
                self.counts[event.host] = self.counts.get(event.host, 0) + event.data.count(b"\n")
                return True
            return False
        if isinstance(event, StateChanged):
            if event.state == JobState.STOPPING:
                self.stopping = True
                for host in self._hosts:
                    self._begin(host)
            elif event.state in (JobState.RESTARTING, JobState.SUCCEEDED) or event.state.terminal:
                self.ended = True
        elif isinstance(event, RankExited) and event.last:
            self.ranks_done.add(event.host)
            self._begin(event.host)
        elif isinstance(event, AttemptStarted):
            self.stopping = False
            self.ranks_done.clear()
            self._begun.clear()
            self._hosts = list(event.hosts)
        return False

    def on_event(self, event: JobEvent) -> None:
        """:meth:`see` as a :data:`~corral.job.events.Subscriber` of a job."""
        self.see(event)

    def _begin(self, host: str) -> None:
        if host not in self._begun:
            self._begun.add(host)
            if self._on_begin is not None:
                self._on_begin(host)

    def flush(self) -> list[str]:
        """The notes of every node whose lines were hidden since the last flush."""
        notes = [fold_note(host, count) for host, count in self.counts.items()]
        self.counts.clear()
        self.ended = False
        return notes


def teardown_marker(logs: LogFiles) -> TeardownFold:
    """A fold that records, in the log directory's ``attempts.jsonl``, where each node's
    teardown began in its node log: ``{"attempt": N, "file": "<host>.node.log",
    "teardown": offset}`` (subscribe its :meth:`~TeardownFold.on_event` to the job)."""

    def begin(host: str) -> None:
        logs.flush()
        path = logs.path(host, NODE_RANK_LABEL)
        try:
            offset = path.stat().st_size
        except OSError:
            offset = 0
        entry = {"attempt": logs.attempt, "file": path.name, "teardown": offset}
        with append_private(logs.log_dir / ATTEMPT_INDEX) as index:
            index.write(json.dumps(entry).encode() + b"\n")

    return TeardownFold(on_begin=begin)
