"""Issue 33 item 6: a split that accounts for each rank's fixed per-step cost.

Calibration fits ``t(b) = f + b / r`` per rank from steps of two batch sizes; the
run exports ``k_i = r_i f_i`` (examples) and the SDK makes ``f_i + b_i / r_i``
equal; without a fixed cost everything is the proportional split of before."""

from __future__ import annotations

import asyncio
import itertools
import math
from pathlib import Path

import pytest

from corral.calibrate.measure import _Collector
from corral.cluster.model import Cluster, Host
from corral.contract import (
    CALIBRATE_ENV,
    PLAN_NODE_ENV,
    REPLICA_GROUP_ENV,
    STEP_OVERHEADS_ENV,
    WORKLOAD_WEIGHTS_ENV,
)
from corral.job.drift import DriftMonitor
from corral.job.events import AttemptStarted, Progress
from corral.plan.spec import JobSpec
from corral.sdk._calibrate import calibration_batch
from corral.sdk._memory import memory_split
from corral.sdk._weights import apportion, batch_sizes, equal_time_batches, step_overheads
from corral.throughput.model import Calibration, parse_calibration, save_calibration
from corral.throughput.resolve import overheads_env, resolve_overheads, resolve_weights
from corral.throughput.weights import (
    MeasuredRank,
    Sample,
    build_calibration,
    rate_of,
    step_cost,
)


def _step_time(batch: float, rate: float, fixed: float) -> float:
    return fixed + batch / rate


# -- the split --------------------------------------------------------------------------


def test_equal_rates_with_different_fixed_costs_get_unequal_batches() -> None:
    # both ranks do 1000 examples/s beyond a fixed cost; rank 1's step costs 60 ms
    # more (its optimizer step at half a CPU): it gets fewer examples, and the step
    # times come out equal
    rates, fixed = (1000.0, 1000.0), (0.02, 0.08)
    overheads = [r * f for r, f in zip(rates, fixed, strict=True)]
    b = equal_time_batches(256, (0.5, 0.5), overheads)
    assert sum(b) == pytest.approx(256)
    assert b == pytest.approx((158.0, 98.0))
    times = [_step_time(x, r, f) for x, r, f in zip(b, rates, fixed, strict=True)]
    assert times[0] == pytest.approx(times[1])
    assert batch_sizes(256, (0.5, 0.5), 2, overheads) == (158, 98)  # proportional: 128, 128


def test_half_speed_with_a_doubled_fixed_cost_equalises_whole_steps() -> None:
    # tb2 at half a CPU: half the rate and twice the fixed cost; the proportional
    # split (2/3, 1/3) leaves tb2 slower by its extra fixed cost
    rates, fixed = (1000.0, 500.0), (0.03, 0.06)
    weights = (2 / 3, 1 / 3)
    overheads = [r * f for r, f in zip(rates, fixed, strict=True)]
    b = equal_time_batches(300, weights, overheads)
    equal = [_step_time(x, r, f) for x, r, f in zip(b, rates, fixed, strict=True)]
    assert equal[0] == pytest.approx(equal[1])
    proportional = [
        _step_time(300 * w, r, f) for w, r, f in zip(weights, rates, fixed, strict=True)
    ]
    assert max(equal) < max(proportional)  # the slow rank no longer paces the step
    assert b[1] < 100


def test_without_fixed_costs_the_split_is_exactly_the_proportional_one() -> None:
    for weights in ((1 / 3, 2 / 3), (0.2, 0.3, 0.5), (0.1, 0.1, 0.1, 0.7), (0.25,) * 4):
        assert equal_time_batches(97, weights, None) == weights
        assert equal_time_batches(97, weights, [0.0] * len(weights)) == weights
        for total in range(len(weights), 300, 7):
            expected = apportion(total, weights)
            assert batch_sizes(total, weights, len(weights)) == expected
            assert batch_sizes(total, weights, len(weights), [0.0] * len(weights)) == expected


def test_every_rank_keeps_at_least_one_example_and_the_rest_stays_equal_in_time() -> None:
    # rank 2's fixed cost alone exceeds the others' whole step: it gets one example
    weights, overheads = (0.4, 0.4, 0.2), (1.0, 1.0, 500.0)
    b = equal_time_batches(40, weights, overheads)
    assert b[2] == 1.0 and sum(b) == pytest.approx(40)
    assert b[0] == pytest.approx(b[1]) == pytest.approx(19.5)
    assert batch_sizes(40, weights, 3, overheads) == (20, 19, 1)
    for total, world in itertools.product((3, 4, 10), (3,)):
        assert min(batch_sizes(total, weights, world, overheads)) >= 1
        assert sum(batch_sizes(total, weights, world, overheads)) == total


def test_bad_overheads_are_named() -> None:
    with pytest.raises(ValueError, match="3 step overheads for 2 ranks"):
        equal_time_batches(10, (0.5, 0.5), (1.0, 1.0, 1.0))
    with pytest.raises(ValueError, match=">= 0"):
        equal_time_batches(10, (0.5, 0.5), (1.0, -1.0))
    env = {STEP_OVERHEADS_ENV: "3,x", "WORLD_SIZE": "2"}
    with pytest.raises(ValueError, match=rf"{STEP_OVERHEADS_ENV}=.*entry 1 \('x'\)"):
        step_overheads(env)


def test_the_overheads_come_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    env = {STEP_OVERHEADS_ENV: "20,80", "WORLD_SIZE": "2", "RANK": "1"}
    assert step_overheads(env) == (20.0, 80.0)
    assert step_overheads({**env, STEP_OVERHEADS_ENV: "0,0"}) is None
    assert step_overheads({**env, REPLICA_GROUP_ENV: "1"}) is None  # torchft: per group
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    monkeypatch.setenv(WORKLOAD_WEIGHTS_ENV, "0.5,0.5")
    monkeypatch.delenv(PLAN_NODE_ENV, raising=False)
    monkeypatch.delenv(REPLICA_GROUP_ENV, raising=False)
    assert batch_sizes(256) == (158, 98)  # the sampler and loss_scale use batch_sizes


def test_accumulation_still_applies_to_the_equal_time_batch() -> None:
    split = memory_split(256, (0.5, 0.5), (None, 40), overheads=(20.0, 80.0))
    assert [m.batch for m in split] == [158, 98]
    assert (split[1].micro, split[1].accumulation) == (33, 3)
    assert memory_split(256, (0.5, 0.5), (None, 40)) == memory_split(
        256, (0.5, 0.5), (None, 40), overheads=None
    )


# -- measuring the fixed cost -----------------------------------------------------------


def _alternating(
    rate: float, fixed: float, batch: int, count: int, stalls: dict[int, float] | None = None
) -> list[Sample]:
    """One report per step, the full batch and a quarter in turns (stall: extra seconds)."""
    out, now = [], 0.0
    for step in range(1, count + 1):
        b = batch if step % 2 == 0 else batch // 4
        now += _step_time(b, rate, fixed) + (stalls or {}).get(step, 0.0)
        out.append(Sample(now, float(b), steps=1))
    return out


def test_two_batch_sizes_separate_the_fixed_cost_even_with_stalls() -> None:
    samples = _alternating(500.0, 0.06, 400, 40, stalls={7: 0.3, 20: 0.25, 33: 0.4})
    fit = step_cost(samples[1:], samples[0].time)
    assert fit is not None
    assert fit[0] == pytest.approx(0.06) and fit[1] == pytest.approx(500.0)
    rate = rate_of(samples, warmup_until=0.0)
    assert rate is not None and rate.fixed_s == pytest.approx(0.06)
    assert rate.examples_per_s == pytest.approx(500.0)


def test_no_fixed_cost_within_the_noise_is_zero_and_slower_small_batches_are_no_fit() -> None:
    # per step: 100 examples in 0.099 s, 25 in 0.024 s: the line's intercept is below 0
    samples, now = [], 0.0
    for step in range(1, 21):
        b, t = (100, 0.099) if step % 2 == 0 else (25, 0.024)
        now += t
        samples.append(Sample(now, float(b), steps=1))
    fit = step_cost(samples[1:], samples[0].time)
    assert fit is not None and fit[0] == 0.0
    assert fit[1] == pytest.approx((100**2 + 25**2) / (100 * 0.099 + 25 * 0.024))
    backwards = [Sample(s.time, 125 - s.examples, steps=1) for s in samples]
    assert step_cost(backwards[1:], backwards[0].time) is None


def test_steps_shorter_than_the_reports_clock_tick_are_still_fitted() -> None:
    # 0.8 ms and 0.35 ms steps, reported on a millisecond clock: 0 or 1 ms apart
    samples, now = [], 0.0
    for step in range(1, 401):
        b = 128 if step % 2 == 0 else 32
        now += _step_time(b, 1 / 4.6875e-6, 0.0002)
        samples.append(Sample(math.floor(now * 1000) / 1000, float(b), steps=1))
    fit = step_cost(samples[1:], samples[0].time)
    assert fit is not None and fit[1] > 0


def test_a_step_that_is_nearly_all_fixed_cost_gives_no_fit() -> None:
    # 0.1 us per example against 1 ms per step: 1 / a slope that small is noise
    samples = _alternating(1e7, 0.001, 128, 40)
    assert step_cost(samples[1:], samples[0].time) is None


def test_the_fixed_cost_is_used_only_when_every_rank_has_one() -> None:
    fitted = rate_of(_alternating(500.0, 0.06, 400, 30), 0.0)
    plain = rate_of([Sample(0.1 * i, 50.0, steps=1) for i in range(1, 30)], 0.0)
    assert fitted is not None and plain is not None and fitted.fixed_s is not None
    cal = build_calibration(
        [MeasuredRank("a", 0, 0, fitted), MeasuredRank("b", 1, 0, plain)],
        hosts=["a", "b"], job_id="c", seconds=30, script=None, workload="script",
    )  # fmt: skip
    # one rank without a fit: every rate is examples over time, no fixed costs
    assert [r.step_fixed_s for r in cal.ranks] == [None, None]
    assert cal.ranks[0].examples_per_s == pytest.approx(fitted.examples / fitted.seconds)


def test_one_batch_size_measures_no_fixed_cost_as_before() -> None:
    samples = [Sample(0.1 * i, 50.0, steps=1) for i in range(1, 30)]
    assert step_cost(samples[1:], samples[0].time) is None
    rate = rate_of(samples, warmup_until=0.0)
    assert rate is not None and rate.fixed_s is None
    assert rate.examples_per_s == pytest.approx(500.0)
    no_steps = [Sample(s.time, s.examples) for s in _alternating(500.0, 0.06, 400, 20)]
    assert step_cost(no_steps[1:], no_steps[0].time) is None  # steps unknown: not fitted


def _progress(rank: int, time: float, step: int, examples: float) -> Progress:
    return Progress(
        job_id="j", time=time, host="ab"[rank], rank=rank, step=step, metrics={"examples": examples}
    )


def test_the_collector_counts_steps_and_the_calibration_records_the_fixed_cost() -> None:
    collector = _Collector({0: ("a", 0), 1: ("b", 0)}, seconds=30)
    truth = {0: (1000.0, 0.02), 1: (500.0, 0.04)}

    async def feed() -> None:
        for rank, (rate, fixed) in truth.items():
            for step, sample in enumerate(_alternating(rate, fixed, 200, 40), 1):
                collector.on_event(_progress(rank, sample.time, step, sample.examples))
        collector.cancel()

    asyncio.run(feed())
    measured = collector.measured()
    for m in measured:
        rate, fixed = truth[m.rank]
        assert m.rate.fixed_s == pytest.approx(fixed) and m.rate.examples_per_s == pytest.approx(
            rate
        )
    cal = build_calibration(
        measured, hosts=["a", "b"], job_id="c", seconds=30, script=["t.py"], workload="script"
    )
    assert [r.step_fixed_s for r in cal.ranks] == pytest.approx([0.02, 0.04])
    assert "A step costs a fixed time whatever its batch (a:0 20 ms, b:1 40 ms" in (
        cal.calibration_notes
    )
    cluster = Cluster((Host("a"), Host("b")), source="hosts.txt")
    assert resolve_overheads(cal, cluster, None) == pytest.approx((20.0, 20.0))
    assert overheads_env((20.0, 20.0)) == {STEP_OVERHEADS_ENV: "20,20"}


OLD_FILE = """{"hardware_calibration": {"measured_performance": {"a": 300, "b": 150},
        "workload_distribution": {"a": 0.666667, "b": 0.333333}, "calibration_notes": "",
        "when": "2026-11-01T10:00:00Z", "job_id": "c", "seconds": 10, "hosts": ["a", "b"],
        "ranks": [{"rank": 0, "host": "a", "local_rank": 0, "examples_per_s": 300,
                   "share": 0.666667},
                  {"rank": 1, "host": "b", "local_rank": 0, "examples_per_s": 150,
                   "share": 0.333333}]}}"""
"""A calibration file written before the fixed cost was measured."""


def _old_file() -> Calibration:
    return parse_calibration(OLD_FILE, "old.json")


def test_an_old_calibration_file_keeps_todays_split(tmp_path: Path) -> None:
    from corral.job.build import weigh
    from corral.job.describe import JobDescription, JobOptions

    cal = _old_file()
    cluster = Cluster((Host("a"), Host("b")), source="hosts.txt")
    assert resolve_overheads(cal, cluster, None) == (0.0, 0.0)
    assert overheads_env((0.0, 0.0)) == {}
    path = save_calibration(cal, tmp_path / "old.json")
    description = JobDescription(JobOptions(command=("t.py",), launcher="python"), cluster)
    weighed = weigh(description, str(path)).description.options
    assert STEP_OVERHEADS_ENV not in weighed.env
    weights = resolve_weights(cal, cluster, None)
    assert weighed.workload_weights == weights
    assert batch_sizes(300, weights, 2, None) == apportion(300, weights)


def test_a_new_file_exports_the_overheads_and_a_restart_remaps_them(tmp_path: Path) -> None:
    from corral.job.build import weigh
    from corral.job.describe import JobDescription, JobOptions

    measured = [
        MeasuredRank(h, i, 0, rate_of(_alternating(r, f, 200, 30), 0.0))  # type: ignore[arg-type]
        for i, (h, r, f) in enumerate((("a", 1000.0, 0.02), ("b", 500.0, 0.04), ("c", 800.0, 0.01)))
    ]
    cal = build_calibration(
        measured, hosts=["a", "b", "c"], job_id="c", seconds=30, script=None, workload="script"
    )
    path = save_calibration(cal, tmp_path / "new.json")
    cluster = Cluster((Host("a"), Host("b"), Host("c")), source="hosts.txt")
    description = JobDescription(JobOptions(command=("t.py",), launcher="python"), cluster)
    options = weigh(description, str(path)).description.options
    assert options.env[STEP_OVERHEADS_ENV] == "20,20,8"
    weights = tuple(options.workload_weights)
    spec = JobSpec(script="t.py", workload_weights=weights, env=dict(options.env))
    monitor = DriftMonitor(spec.workload_weights, cluster, None)
    monitor.on_event(AttemptStarted(job_id="j", number=0, hosts=["a", "b", "c"], world_size=3))
    survivors = Cluster((Host("a"), Host("c")), source="hosts.txt")
    assert monitor.respec(spec, survivors).env[STEP_OVERHEADS_ENV] == "20,8"


# -- the script side --------------------------------------------------------------------


def test_calibration_batch_alternates_only_under_calibration(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv(CALIBRATE_ENV, raising=False)
    assert [calibration_batch(s, 64) for s in range(4)] == [64, 64, 64, 64]
    monkeypatch.setenv(CALIBRATE_ENV, "1")
    assert [calibration_batch(s, 64) for s in range(4)] == [64, 16, 64, 16]
    assert [calibration_batch(s, 64, every=2) for s in range(6)] == [64, 64, 16, 16, 64, 64]
    assert calibration_batch(1, 2) == 1
    with pytest.raises(ValueError, match="at least 1"):
        calibration_batch(1, 0)


def test_a_file_whose_fixed_cost_is_not_finite_is_refused_naming_the_file() -> None:
    """A calibration file is read from a path a job request names: ``Infinity`` (which
    JSON readers accept) would make every other rank's share zero, not an error."""
    from corral.errors import ConfigError

    text = OLD_FILE.replace(
        '"examples_per_s": 150,', '"examples_per_s": 150, "step_fixed_s": Infinity,'
    )
    assert "Infinity" in text
    parse_calibration(text.replace("Infinity", "0.02"), "good.json")  # a finite one is read
    with pytest.raises(ConfigError, match=r"bad\.json"):
        parse_calibration(text, "bad.json")


@pytest.mark.parametrize("field", ['"examples_per_s": 150', '"share": 0.333333'])
@pytest.mark.parametrize("bad", ["Infinity", "NaN"])
def test_a_rate_that_is_not_finite_is_refused_naming_the_file(field: str, bad: str) -> None:
    """``Infinity`` or ``NaN`` for a rank's measured rate or share (JSON readers
    accept both) made its share 1 and every other rank's 0, or no split at all."""
    from corral.errors import ConfigError

    assert field in OLD_FILE, field
    parse_calibration(OLD_FILE, "good.json")
    name = field.partition(":")[0]
    with pytest.raises(ConfigError, match=r"bad\.json"):
        parse_calibration(OLD_FILE.replace(field, f"{name}: {bad}", 1), "bad.json")
