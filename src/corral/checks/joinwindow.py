"""How long the collective smoke test waits for every rank to join, and what it
says about the ones that did not.

Most of a rank's time to join is ``import torch``: about :data:`IMPORT_CPU_S` of
CPU each. Ranks on one machine share its CPUs, so a machine with R ranks and C
CPUs needs about ``ceil(R / C)`` imports' time (64 testbed hosts on 2 cores: 32
waves, far beyond a fixed 30 s). Each runner reports its machine (the kernel's
boot id: hosts that share a kernel share its CPUs) and its CPU count before any
rank imports torch; the window is the given base, or more when the busiest
machine needs it: ``SETUP_S + SAFETY * IMPORT_CPU_S * waves``, at most
:data:`MAX_WINDOW_S`. Every rank reports its measured import time with its
join, and the verdict names how many hosts joined and which are late.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

__all__ = [
    "IMPORT_CPU_S",
    "MAX_WINDOW_S",
    "RunnerFacts",
    "host_cap",
    "join_window",
    "late_summary",
]

#: CPU seconds of one ``import torch`` (1.4-1.6 s measured on a 2-core test machine).
IMPORT_CPU_S = 2.0
#: Interpreter and runner start, store connections, the rendezvous itself.
SETUP_S = 5.0
#: Headroom for a machine that is busy with other work as well.
SAFETY = 1.5
MAX_WINDOW_S = 600.0
SHOWN = 8


@dataclass(frozen=True)
class RunnerFacts:
    """What one host's runner said about its machine before starting its ranks."""

    ranks: int
    machine: str | None = None  # the kernel's boot id (None: unknown, its own machine)
    cpus: int | None = None


def _needed(waves: int) -> float:
    return SETUP_S + SAFETY * IMPORT_CPU_S * waves


def join_window(base: float, runners: Mapping[str, RunnerFacts]) -> float:
    """Seconds to wait for every rank: ``base`` or what the busiest machine needs."""
    ranks: dict[str, int] = {}
    cpus: dict[str, int] = {}
    for host, facts in runners.items():
        key = facts.machine or f"host:{host}"
        ranks[key] = ranks.get(key, 0) + facts.ranks
        cpus[key] = max(cpus.get(key, 1), facts.cpus or 1)
    waves = max((math.ceil(ranks[k] / cpus[k]) for k in ranks), default=1)
    return min(MAX_WINDOW_S, max(base, _needed(waves)))


def host_cap(base: float, world: int) -> float:
    """The hosts' own deadline: the window's largest possible value for ``world``
    ranks (all on one single-CPU machine); the coordinator stops them earlier."""
    return min(MAX_WINDOW_S, max(base, _needed(world)))


def _names(hosts: Sequence[str]) -> str:
    shown = ", ".join(hosts[:SHOWN])
    return shown + (f" (+{len(hosts) - SHOWN} more)" if len(hosts) > SHOWN else "")


def late_summary(
    joined: Sequence[str],
    late: Sequence[str],
    window: float,
    import_s: Iterable[float],
    *,
    named: bool = True,
) -> str:
    """``12 of 64 hosts joined within 74 s; late: tb13, ... (+48 more); torch import
    took 9.1 s (median, up to 30 s) where it finished`` (``named=False``: without
    the late hosts' names)."""
    total = len(joined) + len(late)
    text = f"{len(joined)} of {total} hosts joined within {window:.0f} s"
    if late and named:
        text += f"; late: {_names(late)}"
    times = sorted(import_s)
    if times:
        text += (
            f"; torch import took {statistics.median(times):.1f} s (median, up to "
            f"{times[-1]:.1f} s) where it finished"
        )
    return text
