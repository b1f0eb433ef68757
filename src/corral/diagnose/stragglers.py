"""Straggler scores: which rank the whole job waits for (pure, no I/O).

Each rank's progress report may carry the seconds it spent in named sections
since its previous report (``sdk.section("compute")``, or the DDP hook's
``compute``/``wait``). :class:`StragglerScores` scores every rank's sections
two ways, as NVIDIA's resiliency extension does:

* against the **median** of the other ranks' latest values (a rank slower than
  its peers: a slow GPU, a busy host, a throttled NIC on its side);
* against its **own best** value so far (a rank that got slower than it was:
  thermal throttling, a noisy neighbour), counted only while the rank is also
  above its peers' median, so a job that slows down as a whole (longer
  sequences, an evaluation pass) names nobody.

A rank whose score stays at or above :attr:`StragglerPolicy.threshold` (and
at least :attr:`StragglerPolicy.min_excess` seconds over the reference) for
:attr:`StragglerPolicy.reports` reports in a row is named once, as a
:class:`Straggler`; it can be named again after as many reports below.

Sections whose name starts with ``wait`` (``wait``, ``wait_data``) are where a
rank waits for others: a straggler waits *least*, so they are kept but never
scored. Sections named ``compute*`` are the rank's own compute time
(:func:`is_compute_section`): a straggler there is what ``--rebalance`` may act
on (:mod:`corral.job.drift`).
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Literal

__all__ = [
    "Basis",
    "RankKey",
    "Straggler",
    "StragglerPolicy",
    "StragglerScores",
    "is_compute_section",
    "is_wait_section",
    "median_ratios",
]

RankKey = tuple[str, int]  # (host, global rank)
Basis = Literal["median", "best"]


def is_wait_section(name: str) -> bool:
    """Whether ``name`` is time spent waiting for other ranks (never scored)."""
    return name.lower().startswith("wait")


def is_compute_section(name: str) -> bool:
    """Whether ``name`` times the rank's own compute (``compute``, ``compute_fwd``: the
    DDP hook's and the documented section name): only such a straggler is evidence that
    its node is slower, and may move work away from it (``--rebalance``)."""
    return name.lower().startswith("compute")


def median_ratios(values: Mapping[RankKey, float]) -> dict[RankKey, float]:
    """Each rank's value over the median of the *other* ranks' values (1.0 when there
    is no other rank or the median is 0)."""
    ratios: dict[RankKey, float] = {}
    for key, value in values.items():
        others = [v for k, v in values.items() if k != key]
        reference = statistics.median(others) if others else 0.0
        ratios[key] = value / reference if reference > 0 else 1.0
    return ratios


@dataclass(frozen=True)
class StragglerPolicy:
    """When a rank is named: ``threshold`` times its reference for ``reports``
    reports in a row, each at least ``min_excess`` seconds over it; its own best
    counts after ``warmup`` reports (the first steps compile and warm caches)."""

    threshold: float = 1.5
    reports: int = 5
    min_excess: float = 0.005
    warmup: int = 3

    def __post_init__(self) -> None:
        if not self.threshold > 1.0:
            raise ValueError(f"straggler threshold must be more than 1 (got {self.threshold:g})")
        if self.reports < 1:
            raise ValueError(f"straggler reports must be at least 1 (got {self.reports})")
        if self.min_excess < 0 or self.warmup < 0:
            raise ValueError("straggler min_excess and warmup must not be negative")


@dataclass(frozen=True)
class Straggler:
    """A rank named a straggler: its ``section`` took ``ratio`` times the ``basis``
    (the others' median, or its own best) for ``span`` steps (reports when the
    reports carried no step), up to ``step``; ``seconds`` against ``reference``."""

    host: str
    rank: int
    section: str
    ratio: float
    basis: Basis
    span: int
    step: int | None
    seconds: float
    reference: float
    unit: Literal["steps", "reports"] = "steps"

    def message(self) -> str:
        """``straggler: rank 1 on local-1, compute 5.1x the median for 20 steps``."""
        against = "the median" if self.basis == "median" else "its own best"
        unit = self.unit if self.span != 1 else self.unit[:-1]
        return (
            f"straggler: rank {self.rank} on {self.host}, {self.section} "
            f"{self.ratio:.1f}x {against} for {self.span} {unit}"
        )


@dataclass
class _Streak:
    above: int = 0  # reports in a row at or above the threshold
    below: int = 0  # reports in a row under it (after being named)
    first_step: int | None = None
    named: bool = False


@dataclass
class _Section:
    latest: dict[RankKey, float] = field(default_factory=dict)
    best: dict[RankKey, float] = field(default_factory=dict)
    seen: dict[RankKey, int] = field(default_factory=dict)
    streaks: dict[RankKey, _Streak] = field(default_factory=dict)


class StragglerScores:
    """Scores every rank's sections as reports arrive; names persistent stragglers."""

    def __init__(self, policy: StragglerPolicy | None = None) -> None:
        self.policy = policy or StragglerPolicy()
        self._sections: dict[str, _Section] = {}
        self._ratios: dict[RankKey, dict[str, float]] = {}
        self.named: list[Straggler] = []  # every straggler named so far, in order

    def observe(
        self, host: str, rank: int, step: int | None, sections: Mapping[str, float]
    ) -> list[Straggler]:
        """Record one report's ``sections`` (seconds) of ``rank`` on ``host``; the
        stragglers named by it (usually none)."""
        key = (host, rank)
        found: list[Straggler] = []
        for name, value in sections.items():
            if is_wait_section(name) or not value >= 0:
                continue
            named = self._observe(
                self._sections.setdefault(name, _Section()), key, name, step, value
            )
            if named is not None:
                found.append(named)
        self.named.extend(found)
        return found

    def _observe(
        self, section: _Section, key: RankKey, name: str, step: int | None, value: float
    ) -> Straggler | None:
        policy = self.policy
        section.latest[key] = value
        seen = section.seen[key] = section.seen.get(key, 0) + 1
        others = [v for k, v in section.latest.items() if k != key]
        median = statistics.median(others) if others else None
        ratio_median = value / median if median else 1.0
        self._ratios.setdefault(key, {})[name] = ratio_median
        best = section.best.get(key)
        scored: tuple[float, Basis, float] | None = None
        if (
            median is not None
            and ratio_median >= policy.threshold
            and value - median >= policy.min_excess
        ):
            scored = (ratio_median, "median", median)
        if scored is None and best and seen > policy.warmup and value / best >= policy.threshold:
            peers_ok = median is None or value - median >= policy.min_excess
            if peers_ok and value - best >= policy.min_excess:
                scored = (value / best, "best", best)
        if seen > policy.warmup or best is None:
            section.best[key] = value if best is None else min(best, value)
        streak = section.streaks.setdefault(key, _Streak())
        if scored is None:
            streak.above = 0
            streak.first_step = None
            if streak.named:
                streak.below += 1
                if streak.below >= policy.reports:
                    streak.named = False
            return None
        streak.below = 0
        if streak.above == 0:
            streak.first_step = step
        streak.above += 1
        if streak.named or streak.above < policy.reports:
            return None
        streak.named = True
        ratio, basis, reference = scored
        unit: Literal["steps", "reports"] = "steps"
        if step is not None and streak.first_step is not None and step >= streak.first_step:
            span = step - streak.first_step + 1
        else:
            span, unit = streak.above, "reports"
        return Straggler(key[0], key[1], name, ratio, basis, span, step, value, reference, unit)

    def ratios(self) -> dict[RankKey, dict[str, float]]:
        """Each rank's latest score against the median of the others, per section."""
        return {key: dict(values) for key, values in self._ratios.items()}

    def forget(self, keys: Iterable[RankKey]) -> None:
        """Drop what is known of ``keys`` (ranks that exited or were restarted)."""
        gone = set(keys)
        for section in self._sections.values():
            for key in gone:
                section.latest.pop(key, None)
                section.best.pop(key, None)
                section.seen.pop(key, None)
                section.streaks.pop(key, None)
        for key in gone:
            self._ratios.pop(key, None)
