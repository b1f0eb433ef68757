"""What an attempt of a job comes to, in the terms the layers below the engine read.

A leaf module (standard library and :mod:`corral.states` only): corral's exit
codes, the level of a message, and :class:`AttemptOutcome`, the part of the
engine's :class:`~corral.job.result.JobResult` that a restart decision
(:mod:`corral.recovery.restart`) reads. :mod:`corral.job.result` and
:mod:`corral.job.events` re-export these names.
"""

from __future__ import annotations

import signal
from collections.abc import Sequence
from typing import Literal, Protocol

from corral.states import JobState, NodeState

#: corral's exit codes besides 0 and the failing rank's own code.
EXIT_SIGNAL_BASE = 128  # rank killed by signal N -> 128 + N
EXIT_TIMEOUT = 124  # --timeout reached
EXIT_INTERRUPTED = 130  # Ctrl-C / SIGTERM to corral
EXIT_LOST = 255  # a host was lost (connection or agent died)
EXIT_LAUNCH = 3  # a node could not be started / the master never came up
EXIT_HANG = 125  # hang detection stopped the job (no progress for --hang-timeout)

Level = Literal["info", "success", "warning", "error", "detail", "output"]
"""How a message matters: ``output`` is a line of someone else's (a sync script)."""


def signal_name(code: int | None) -> str | None:
    """``SIGKILL`` for -9 (and for 137, the shell's 128+9), else None."""
    if code is None:
        return None
    num = -code if code < 0 else code - EXIT_SIGNAL_BASE if code > EXIT_SIGNAL_BASE else 0
    if num <= 0:
        return None
    try:
        return signal.Signals(num).name
    except ValueError:
        return f"signal {num}"


class Named(Protocol):
    """A host, as far as an outcome names it."""

    @property
    def name(self) -> str: ...


class NodeOutcome(Protocol):
    """One node of an attempt: its host and where it ended."""

    @property
    def host(self) -> Named: ...

    @property
    def state(self) -> NodeState: ...


class Cause(Protocol):
    """The root cause of a failed attempt."""

    @property
    def host(self) -> str: ...

    @property
    def rank(self) -> int | None: ...

    @property
    def message(self) -> str: ...

    @property
    def could_not_start(self) -> bool: ...


class AttemptOutcome(Protocol):
    """How one attempt ended (:class:`corral.job.result.JobResult` is one)."""

    @property
    def state(self) -> JobState: ...

    @property
    def exit_code(self) -> int: ...

    @property
    def ended(self) -> float: ...

    @property
    def reason(self) -> str: ...

    @property
    def nodes(self) -> Sequence[NodeOutcome]: ...

    @property
    def root_cause(self) -> Cause | None: ...


__all__ = [
    "EXIT_HANG",
    "EXIT_INTERRUPTED",
    "EXIT_LAUNCH",
    "EXIT_LOST",
    "EXIT_SIGNAL_BASE",
    "EXIT_TIMEOUT",
    "AttemptOutcome",
    "Cause",
    "Level",
    "Named",
    "NodeOutcome",
    "signal_name",
]
