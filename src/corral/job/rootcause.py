"""Which failure of an attempt is its root cause: decided by what happened, not by
the order the reports reached the coordinator.

A rank killed by a signal nobody of the job sent (SIGKILL from the OOM killer or a
user, a segfault, an abort), a lost host and a hang are *causes*; a rank's own
error (an exception, a non-zero exit) comes next; a rank that failed because a
collective lost its peer (gloo's "Connection closed by peer [10.0.0.2]:...",
NCCL's "remote process exited", a reset connection) or that was terminated by a
teardown (SIGTERM, SIGINT, SIGHUP, SIGPIPE, or any signal the node agent sent
while tearing down) is a *symptom*. Within a class the earliest failure wins,
dated by the rank's error file (written when the exception was raised) when it has
one. So a survivor whose collective broke 50 ms after its peer was SIGKILLed is
never named the root cause, even when the peer's report (torchrun reports a
SIGKILLed rank only when it exits; a loaded host reads the rank's end late)
arrives after the survivor's and after the job was stopped.
"""

from __future__ import annotations

import re
import signal
import time
from collections.abc import Callable, Iterable
from enum import IntEnum

from corral.job.result import Failure, RankRecord, signal_name

__all__ = [
    "CauseClass",
    "classify",
    "collective_peer",
    "counts_after_stop",
    "ordered",
    "precedes",
    "rank_failure",
]


class CauseClass(IntEnum):
    """How strongly a failure explains the others (lower: more)."""

    CAUSE = 0  # killed by a signal from outside the job, a lost host, a hang
    ERROR = 1  # the rank's own error
    SYMPTOM = 2  # a broken collective, or a teardown's signal


#: Signals a teardown sends (the node agent, torchrun to its other ranks, a shell).
TEARDOWN_SIGNALS = frozenset(
    int(s) for s in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGPIPE)
)

# what gloo, NCCL, torch.distributed and torchft say when a peer went away
_COLLECTIVE = re.compile(
    r"connection (?:closed|reset) by peer|broken pipe|ECONNRESET|remote process exited"
    r"|DistBackendError|DistNetworkError|NCCL communicator was aborted"
    r"|connection to a peer was lost"
    r"|ProcessGroup(?:Gloo|NCCL)\b.*(?:error|fail)|gloo/transport|peer (?:closed|hung up)",
    re.IGNORECASE,
)
_PEER = re.compile(r"by peer \[?([0-9A-Za-z.:_-]+?)\]?:(\d+)", re.IGNORECASE)


def _evidence(failure: Failure) -> str:
    """The failure's own words: its traceback and its stderr tail."""
    return (failure.traceback or "") + "\n" + "\n".join(failure.stderr_tail[-40:])


def collective_peer(failure: Failure) -> str | None:
    """The peer a broken collective names (``10.0.0.2``), if it names one."""
    match = _PEER.search(_evidence(failure))
    return match.group(1) if match else None


def classify(failure: Failure) -> CauseClass:
    """The failure's class (module doc)."""
    if failure.by_teardown:
        return CauseClass.SYMPTOM
    if failure.tail:  # a hang, its stuck rank's stack in place of stderr
        return CauseClass.CAUSE
    if failure.rank is None:  # a lost host, a launcher's or a join failure
        lost = failure.message.startswith("lost host")
        launcher = failure.code is not None and failure.code > 0 and not lost
        return CauseClass.ERROR if launcher else CauseClass.CAUSE
    code = failure.code
    if code is not None and code < 0:
        return CauseClass.SYMPTOM if -code in TEARDOWN_SIGNALS else CauseClass.CAUSE
    if _COLLECTIVE.search(_evidence(failure)):
        return CauseClass.SYMPTOM
    return CauseClass.ERROR


def _key(failure: Failure) -> tuple[int, float]:
    return (int(classify(failure)), failure.time)


def precedes(failure: Failure, other: Failure) -> bool:
    """Whether ``failure`` explains ``other`` better (a stronger class, or the same
    class and earlier)."""
    return _key(failure) < _key(other)


def ordered(failures: Iterable[Failure]) -> list[Failure]:
    """``failures``, the root cause first (module doc)."""
    return sorted(failures, key=_key)


def counts_after_stop(code: int | None, *, by_teardown: bool, stopped_late: bool) -> bool:
    """Whether a rank's end reported as happening after the job was stopped still
    counts as a failure: only a death by a signal that no teardown sent (its host
    read the end late, or torchrun reported it only when it exited).
    ``stopped_late``: its time is after the stop decision."""
    if not stopped_late:
        return True
    return not by_teardown and code is not None and code < 0 and -code not in TEARDOWN_SIGNALS


def rank_failure(
    record: RankRecord, to_local: Callable[[float], float], *, by_teardown: bool
) -> Failure:
    """The failure a rank's end makes, dated when it happened: its error file's
    timestamp (written as the exception was raised) when earlier than the end its
    agent saw (``to_local`` puts the host's times on the coordinator's clock)."""
    code, host = record.code, record.host
    what = (
        f"killed by {signal_name(code)}"
        if signal_name(code) and (code or 0) < 0
        else "exited without reporting a status"
        if code is None
        else f"exited with code {code}"
    )
    when = record.time or time.time()
    error = record.error or {}
    stamp = error.get("timestamp")
    if isinstance(stamp, (int, float)) and not isinstance(stamp, bool):
        when = min(when, to_local(float(stamp)))
    return Failure(
        host,
        record.rank,
        code,
        when,
        f"rank {record.rank} on {host} {what}",
        list(record.stderr_tail),
        error.get("traceback"),
        by_teardown=by_teardown,
    )
