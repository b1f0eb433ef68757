"""From progress reports to examples/s, shares, notes and a :class:`Calibration` (pure).

A rank's reports are ``(time, examples)`` samples, ``examples`` being what it
processed since its previous report (``sdk.report(step, examples=n)``). Its
rate is the examples reported after a warm-up *anchor* divided by the time from
the anchor to its last report: what was done before the anchor (imports, the
first, slow steps, a JIT) is not counted. With ``busy`` seconds in the reports
(the rank's own compute time since its previous report) the rate is examples
per busy second instead, which is what a rank is capable of even while
collectives make it wait for slower ones.

A rank's step also costs a fixed time whatever its batch (the optimizer step,
Python, the report). When its reports cover steps of at least two batch sizes
(``sdk.calibration_batch`` alternates the full batch and a quarter of it) and say
how many steps they cover (the ``step`` of ``sdk.report``), :func:`step_cost`
fits ``t(b) = f + b / r`` to the step time of each batch size (the mean of its
fastest 80%: stalls dropped, and finer than the reports' millisecond): the rate is
then the per-example rate ``r`` and ``fixed_s`` the fixed cost ``f``, which the
split uses to make the step times equal (``sdk.equal_time_batches``). With one
batch size ``f`` is not measured and the rate is examples over time, as always.

Shares are rates over their sum; when the fastest rank is within
:data:`NOISE_RATIO` of the slowest, the measured difference is noise and the
split stays even (seed 000: "Equal performance measured across all workers.
Pipeline is overhead-bound, not compute-bound.").
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass, replace
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
    "step_cost",
]

#: Fastest / slowest below this is treated as equal performance (an even split).
NOISE_RATIO = 1.10
#: A rank whose rate varied more than this between parts of its window is named.
NOISY_VARIATION = 0.25
#: The window is cut into this many parts to measure the variation.
_PARTS = 5
#: Fitting a fixed step cost needs batch sizes at least this far apart ...
_FIT_SPREAD = 1.5
#: ... and this many steps of each.
_FIT_STEPS = 3
#: The fraction of each batch size's step times kept (the fastest): stalls are dropped.
_FIT_KEEP = 0.8
#: The per-example part must be at least this share of the largest batch's step, or
#: its rate (1 / a slope near 0) is noise: then no fit.
_FIT_MIN_SHARE = 0.2


@dataclass(frozen=True)
class Sample:
    """One progress report: when (seconds), examples since the previous report and,
    when the rank reports it, the seconds it computed since then."""

    time: float
    examples: float
    busy: float | None = None
    steps: int | None = None
    """Training steps since the previous report (None: not known)."""


@dataclass(frozen=True)
class Rate:
    """A rank's throughput over its measurement window."""

    examples_per_s: float
    examples: float
    seconds: float
    reports: int
    variation: float | None = None
    fixed_s: float | None = None
    """Seconds a step costs whatever its batch (None: not measured); then
    ``examples_per_s`` is the per-example rate of ``t(b) = fixed_s + b / rate``."""


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


def _low_mean(times: list[float]) -> float:
    """The mean of the lower :data:`_FIT_KEEP` of ``times``: a stall (another process, a
    page fault) is dropped, and unlike a median it resolves steps shorter than the
    reports' clock (a millisecond: the mean of its ticks)."""
    ordered = sorted(times)
    return statistics.fmean(ordered[: max(1, round(len(ordered) * _FIT_KEEP))])


def step_cost(samples: Sequence[Sample], start: float) -> tuple[float, float] | None:
    """``(f, r)`` of ``t(b) = f + b / r`` fitted to the reports after ``start`` (in
    time order), or None when they do not tell a fixed cost from a per-example one:
    fewer than two batch sizes at least :data:`_FIT_SPREAD` apart with
    :data:`_FIT_STEPS` steps each, reports without ``steps``, or smaller batches
    that were not faster (or barely: the per-example part under
    :data:`_FIT_MIN_SHARE` of the largest batch's step). A fixed cost below 0 is 0,
    with the rate of the line through the origin. Each batch size counts with the
    mean of its faster steps (:func:`_low_mean`), so a stall does not move the line."""
    times: dict[float, list[float]] = {}
    previous = start
    for sample in samples:
        duration, previous = sample.time - previous, sample.time
        if sample.steps is None:
            return None
        if sample.steps <= 0 or sample.examples <= 0 or duration < 0:
            continue  # (0 s: a step within one tick of the reports' clock, kept)
        batch = round(sample.examples / sample.steps, 3)
        times.setdefault(batch, []).extend([duration / sample.steps] * sample.steps)
    points = [(b, _low_mean(t)) for b, t in times.items() if len(t) >= _FIT_STEPS]
    if len(points) < 2 or max(p[0] for p in points) < _FIT_SPREAD * min(p[0] for p in points):
        return None
    mean_b = statistics.fmean(b for b, _ in points)
    mean_t = statistics.fmean(t for _, t in points)
    spread = sum((b - mean_b) ** 2 for b, _ in points)
    slope = sum((b - mean_b) * (t - mean_t) for b, t in points) / spread
    if slope <= 0:
        return None  # smaller batches no faster: not a cost per example
    top = max(points)
    if slope * top[0] < _FIT_MIN_SHARE * top[1]:
        return None  # the step is nearly all fixed cost: its per-example rate is noise
    fixed = mean_t - slope * mean_b
    if fixed <= 0:  # no fixed cost within the noise: the line through the origin
        return 0.0, sum(b * b for b, _ in points) / sum(b * t for b, t in points)
    return fixed, 1.0 / slope


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
    cost = None
    if all(b is not None for b in busy) and sum(b for b in busy if b is not None) > 0:
        denominator = sum(b for b in busy if b is not None)
    else:  # whole steps timed: a fixed cost per step is measurable
        cost = step_cost(window, start)
    return Rate(
        examples_per_s=examples / denominator if cost is None else cost[1],
        examples=examples,
        seconds=seconds,
        reports=len(window),
        variation=_variation(window, start),
        fixed_s=None if cost is None else cost[0],
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
    fixed = [
        f"{m.label} {m.rate.fixed_s * 1000:.3g} ms" for m in measured if m.rate.fixed_s is not None
    ]
    if fixed:
        text += (
            f" A step costs a fixed time whatever its batch ({', '.join(fixed)}; the rates "
            "are per example beyond it): the split makes the ranks' whole step times "
            "equal, so a rank with a larger fixed cost gets fewer examples than its share."
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


def _without_fit(m: MeasuredRank) -> MeasuredRank:
    """``m`` with its rate as examples over time and no fixed cost."""
    if m.rate.fixed_s is None:
        return m
    rate = replace(m.rate, examples_per_s=m.rate.examples / m.rate.seconds, fixed_s=None)
    return replace(m, rate=rate)


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
    if any(m.rate.fixed_s is None for m in ordered):  # all or none: one meaning of a rate
        ordered = [_without_fit(m) for m in ordered]
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
                step_fixed_s=None if m.rate.fixed_s is None else round(m.rate.fixed_s, 6),
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
