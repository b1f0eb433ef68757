"""From progress reports to examples/s, shares, notes and a :class:`Calibration` (pure).

A rank's reports are ``(time, examples)`` samples, ``examples`` being what it
processed since its previous report (``sdk.report(step, examples=n)``). Its
rate is the examples reported after a warm-up *anchor* divided by the time from
the anchor to its last report: what was done before the anchor (imports, the
first, slow steps, a JIT) is not counted. With ``busy`` seconds in the reports
(the rank's own compute time since its previous report) the rate is examples
per busy second instead, which is what a rank is capable of even while
collectives make it wait for slower ones.

Shares are rates over their sum; when the fastest rank is within
:data:`NOISE_RATIO` of the slowest, the measured difference is noise and the
split stays even (seed 000: "Equal performance measured across all workers.
Pipeline is overhead-bound, not compute-bound.").
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timezone

from corral.throughput.model import Calibration, RankRate, Workload

__all__ = [
    "NOISE_RATIO",
    "NOISY_VARIATION",
    "MeasuredRank",
    "Rate",
    "Sample",
    "build_calibration",
    "describe",
    "rate_of",
    "shares",
    "speedup",
]

#: Fastest / slowest below this is treated as equal performance (an even split).
NOISE_RATIO = 1.10
#: A rank whose rate varied more than this between parts of its window is named.
NOISY_VARIATION = 0.25
#: The window is cut into this many parts to measure the variation.
_PARTS = 5


@dataclass(frozen=True)
class Sample:
    """One progress report: when (seconds), examples since the previous report and,
    when the rank reports it, the seconds it computed since then."""

    time: float
    examples: float
    busy: float | None = None


@dataclass(frozen=True)
class Rate:
    """A rank's throughput over its measurement window."""

    examples_per_s: float
    examples: float
    seconds: float
    reports: int
    variation: float | None = None


@dataclass(frozen=True)
class MeasuredRank:
    """A rank's identity and its rate."""

    host: str
    rank: int
    local_rank: int
    rate: Rate
    fits: int | None = None
    """The largest micro-batch the rank fits (None: no limit found or not probed)."""

    @property
    def label(self) -> str:
        """``host:rank`` as log prefixes write it."""
        return f"{self.host}:{self.rank}"


def _variation(window: Sequence[Sample], start: float) -> float | None:
    """Coefficient of variation of the rate over equal parts of the window."""
    end = window[-1].time
    if len(window) < 2 * _PARTS or end <= start:
        return None
    step = (end - start) / _PARTS
    totals = [0.0] * _PARTS
    for sample in window:
        totals[min(int((sample.time - start) / step), _PARTS - 1)] += sample.examples
    mean = statistics.fmean(totals)
    return statistics.pstdev(totals) / mean if mean > 0 else None


def rate_of(samples: Sequence[Sample], warmup_until: float) -> Rate | None:
    """The rate after the warm-up: the anchor is the last report at or before
    ``warmup_until`` (the first report when none is); None with no report after it."""
    ordered = sorted(samples, key=lambda s: s.time)
    if not ordered:
        return None
    anchor = 0
    for index, sample in enumerate(ordered):
        if sample.time <= warmup_until:
            anchor = index
    start = ordered[anchor].time
    window = ordered[anchor + 1 :]
    examples = sum(s.examples for s in window)
    seconds = window[-1].time - start if window else 0.0
    if examples <= 0 or seconds <= 0:
        return None
    busy = [s.busy for s in window]
    denominator = seconds
    if all(b is not None for b in busy):
        total_busy = sum(b for b in busy if b is not None)
        if total_busy > 0:
            denominator = total_busy
    return Rate(
        examples_per_s=examples / denominator,
        examples=examples,
        seconds=seconds,
        reports=len(window),
        variation=_variation(window, start),
    )


def shares(rates: Sequence[float], noise: float = NOISE_RATIO) -> tuple[list[float], bool]:
    """Each rate's share of the total, and whether the spread was within ``noise``
    (then every share is equal)."""
    if not rates or min(rates) <= 0:
        raise ValueError("rates must be positive")
    if max(rates) / min(rates) < noise:
        return [1.0 / len(rates)] * len(rates), True
    total = sum(rates)
    return [r / total for r in rates], False


def speedup(rates: Sequence[float]) -> float:
    """How much faster an epoch is split in proportion than split evenly: an even
    split waits for the slowest rank (n * min), a proportional one does not (sum)."""
    return sum(rates) / (len(rates) * min(rates))


def describe(measured: Sequence[MeasuredRank], equal: bool) -> str:
    """The calibration notes: equal performance, or the spread and the expected
    gain of a proportional split; ranks whose rate was unsteady."""
    rates = [m.rate.examples_per_s for m in measured]
    fast = max(measured, key=lambda m: m.rate.examples_per_s)
    slow = min(measured, key=lambda m: m.rate.examples_per_s)
    ratio = fast.rate.examples_per_s / slow.rate.examples_per_s
    if len(measured) == 1:
        text = "One rank measured: nothing to split."
    elif equal:
        text = (
            f"Equal performance measured across all workers (fastest/slowest {ratio:.2f}x, "
            f"within the {NOISE_RATIO:.2f}x noise band): the work is split evenly. On "
            "machines that differ, this means the pipeline is overhead-bound, not "
            "compute-bound."
        )
    else:
        text = (
            f"Throughput differs {ratio:.2f}x between the fastest rank ({fast.label}, "
            f"{fast.rate.examples_per_s:.4g} ex/s) and the slowest ({slow.label}, "
            f"{slow.rate.examples_per_s:.4g} ex/s): the work is split in proportion, "
            f"expected {speedup(rates):.2f}x faster per epoch than an even split."
        )
    noisy = [
        f"{m.label} (±{m.rate.variation:.0%})"
        for m in measured
        if m.rate.variation is not None and m.rate.variation > NOISY_VARIATION
    ]
    if noisy:
        text += (
            f" Unsteady throughput on {', '.join(noisy)}: something else ran there, or "
            "the steps differ in cost; a longer --seconds gives steadier figures."
        )
    capped = [f"{m.label} at {m.fits}" for m in measured if m.fits is not None]
    if capped:
        text += (
            f" Memory caps the micro-batch of {', '.join(capped)}: a share above it runs "
            "as gradient accumulation (several micro-batches per optimizer step)."
        )
    few = [m.label for m in measured if m.rate.reports < _PARTS]
    if few:
        text += f" Few reports from {', '.join(few)}: report more often, or measure longer."
    return text


def build_calibration(
    measured: Sequence[MeasuredRank],
    *,
    hosts: Sequence[str],
    job_id: str,
    seconds: float,
    script: Sequence[str] | None,
    workload: Workload,
    when: datetime | None = None,
    noise: float = NOISE_RATIO,
) -> Calibration:
    """The :class:`Calibration` of ``measured`` (every rank of the job, any order)."""
    ordered = sorted(measured, key=lambda m: m.rank)
    split, equal = shares([m.rate.examples_per_s for m in ordered], noise)
    performance = {h: 0.0 for h in hosts}
    distribution = {h: 0.0 for h in hosts}
    ranks = []
    for m, share in zip(ordered, split, strict=True):
        performance[m.host] = performance.get(m.host, 0.0) + m.rate.examples_per_s
        distribution[m.host] = distribution.get(m.host, 0.0) + share
        ranks.append(
            RankRate(
                rank=m.rank,
                host=m.host,
                local_rank=m.local_rank,
                examples_per_s=round(m.rate.examples_per_s, 6),
                share=round(share, 6),
                examples=m.rate.examples,
                seconds=round(m.rate.seconds, 3),
                reports=m.rate.reports,
                variation=None if m.rate.variation is None else round(m.rate.variation, 4),
                fits=m.fits,
            )
        )
    return Calibration(
        measured_performance={h: round(v, 6) for h, v in performance.items()},
        workload_distribution={h: round(v, 6) for h, v in distribution.items()},
        calibration_notes=describe(ordered, equal),
        when=when or datetime.now(timezone.utc),
        job_id=job_id,
        seconds=seconds,
        hosts=list(hosts),
        ranks=ranks,
        script=None if script is None else list(script),
        workload=workload,
    )
