"""The supervisor's health model: per host and per rank, with documented transitions.

Host (one node agent reached over one transport link)::

    HEALTHY <-> SILENT -> LOST
       |                   ^
       +-------------------+

* HEALTHY: a frame (output, event or the agent's own heartbeat, sent every
  ``heartbeat_interval``) arrived recently.
* SILENT: nothing for more than ``SILENT_AFTER`` heartbeat intervals; a
  warning is printed once, and any frame brings the host back to HEALTHY.
* LOST (terminal): nothing for ``--host-timeout`` seconds, or the transport
  reported the link broken (SSH keepalives unanswered, connection reset), or
  the agent died without reporting. The job is stopped (or restarted without
  that host, see :mod:`corral.recovery.restart`); the agent on a lost host tears
  its own processes down when the coordinator's heartbeats stop reaching it.

Rank::

    STARTED -> PROGRESSING -> EXITED
       |            |
       +------------+-> HUNG -> EXITED

* STARTED: the process runs; it has not reported progress (``sdk.report``) yet.
* PROGRESSING: it reported at least once; hang detection (see
  :mod:`corral.recovery.hang`) watches the time since its step last advanced.
* HUNG: hang detection named it; its stack was dumped; teardown follows.
* EXITED (terminal): its exit status is known (or it was torn down).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from corral.defaults import DEFAULT_HOST_TIMEOUT as DEFAULT_HOST_TIMEOUT
from corral.states import IllegalTransition

#: heartbeat intervals of silence after which a host is SILENT (warned about)
SILENT_AFTER = 3


class HostHealth(str, enum.Enum):
    """Liveness of one host's agent and its link, as the coordinator sees it."""

    HEALTHY = "healthy"
    SILENT = "silent"
    LOST = "lost"


class RankHealth(str, enum.Enum):
    """Liveness and progress of one rank."""

    STARTED = "started"
    PROGRESSING = "progressing"
    HUNG = "hung"
    EXITED = "exited"


HOST_TRANSITIONS: dict[HostHealth, frozenset[HostHealth]] = {
    HostHealth.HEALTHY: frozenset({HostHealth.SILENT, HostHealth.LOST}),
    HostHealth.SILENT: frozenset({HostHealth.HEALTHY, HostHealth.LOST}),
    HostHealth.LOST: frozenset(),
}

RANK_TRANSITIONS: dict[RankHealth, frozenset[RankHealth]] = {
    RankHealth.STARTED: frozenset({RankHealth.PROGRESSING, RankHealth.HUNG, RankHealth.EXITED}),
    RankHealth.PROGRESSING: frozenset({RankHealth.HUNG, RankHealth.EXITED}),
    RankHealth.HUNG: frozenset({RankHealth.EXITED}),
    RankHealth.EXITED: frozenset(),
}


def check_host_transition(old: HostHealth, new: HostHealth) -> HostHealth:
    """Return ``new`` if ``old -> new`` is allowed, else raise IllegalTransition."""
    if new not in HOST_TRANSITIONS[old]:
        raise IllegalTransition(f"host cannot go from {old.value} to {new.value}")
    return new


def check_rank_transition(old: RankHealth, new: RankHealth) -> RankHealth:
    """Return ``new`` if ``old -> new`` is allowed, else raise IllegalTransition."""
    if new not in RANK_TRANSITIONS[old]:
        raise IllegalTransition(f"rank cannot go from {old.value} to {new.value}")
    return new


@dataclass
class HostWatch:
    """When a host was last heard from, and the health that implies (pure: the
    caller passes the clock)."""

    host: str
    last_heard: float
    health: HostHealth = HostHealth.HEALTHY

    def heard(self, now: float) -> None:
        """Any frame arrived from the host."""
        self.last_heard = max(self.last_heard, now)
        if self.health == HostHealth.SILENT:
            self.health = check_host_transition(self.health, HostHealth.HEALTHY)

    def silence(self, now: float) -> float:
        """Seconds since the host was last heard from."""
        return max(0.0, now - self.last_heard)

    def check(self, now: float, *, interval: float, timeout: float) -> HostHealth | None:
        """Advance the health for ``now``; returns the new health when it changed."""
        if self.health == HostHealth.LOST:
            return None
        quiet = self.silence(now)
        if quiet > timeout:
            self.health = check_host_transition(self.health, HostHealth.LOST)
            return self.health
        if self.health == HostHealth.HEALTHY and quiet > SILENT_AFTER * interval:
            self.health = check_host_transition(self.health, HostHealth.SILENT)
            return self.health
        return None

    def lose(self) -> bool:
        """The link broke or the agent died: LOST now. False if it already was."""
        if self.health == HostHealth.LOST:
            return False
        self.health = check_host_transition(self.health, HostHealth.LOST)
        return True
