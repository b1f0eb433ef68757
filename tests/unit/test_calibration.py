"""Calibration: rates from reports, shares and notes, the file, weights for a run, drift."""

from __future__ import annotations

import asyncio
import json
import os
import re
import stat
import subprocess
from dataclasses import replace
from pathlib import Path

import pytest

from corral.calibrate.measure import REFERENCE, CalibrateOptions, _Collector, _shell_writer
from corral.cluster.model import Cluster, Host
from corral.errors import ConfigError, JobFailed
from corral.job.drift import DriftMonitor
from corral.job.events import AttemptStarted, Finished, JobEvent, Message, Progress
from corral.job.states import JobState
from corral.plan.render import plan_job
from corral.plan.spec import JobSpec
from corral.throughput.model import Calibration, load_calibration, save_calibration
from corral.throughput.resolve import planned_ranks, resolve_weights
from corral.throughput.weights import (
    NOISE_RATIO,
    MeasuredRank,
    Rate,
    Sample,
    build_calibration,
    rate_of,
    shares,
    speedup,
)


def _samples(start: float, every: float, count: int, examples: float) -> list[Sample]:
    return [Sample(start + i * every, examples) for i in range(count)]


def _rate(value: float, reports: int = 20, variation: float | None = 0.05) -> Rate:
    return Rate(value, value * 10, 10.0, reports, variation)


def _measured(*rates: tuple[str, int, float]) -> list[MeasuredRank]:
    locals_: dict[str, int] = {}
    out = []
    for rank, (host, _, value) in enumerate(rates):
        local = locals_.get(host, 0)
        locals_[host] = local + 1
        out.append(MeasuredRank(host=host, rank=rank, local_rank=local, rate=_rate(value)))
    return out


def _cluster(*names: str, slots: int = 1) -> Cluster:
    return Cluster(tuple(Host(n, slots=slots) for n in names), source="hosts.txt")


# -- rates ------------------------------------------------------------------------------


def test_rate_counts_only_reports_after_the_warmup_anchor() -> None:
    # a slow first second (imports), then 100 examples every 0.5 s = 200 ex/s
    samples = [Sample(0.0, 5.0), Sample(1.0, 5.0), *_samples(1.5, 0.5, 19, 100.0)]
    rate = rate_of(samples, warmup_until=1.0)
    assert rate is not None
    assert rate.examples_per_s == pytest.approx(200.0)
    assert rate.reports == 19 and rate.seconds == pytest.approx(9.5)
    # counting the warm-up too would be wrong: 10 examples in the first second
    assert rate_of(samples, warmup_until=-1.0).examples_per_s < 200.0  # type: ignore[union-attr]


def test_rate_per_busy_second_when_ranks_report_busy() -> None:
    # lockstep: 50 examples per 1 s step, but only 0.25 s of it computing
    samples = [Sample(float(t), 50.0, 0.25) for t in range(11)]
    rate = rate_of(samples, warmup_until=0.0)
    assert rate is not None and rate.examples_per_s == pytest.approx(200.0)


def test_rate_is_none_without_reports_after_the_anchor() -> None:
    assert rate_of([], 0.0) is None
    assert rate_of([Sample(1.0, 10.0)], 5.0) is None
    assert rate_of([Sample(1.0, 10.0), Sample(2.0, 0.0)], 1.0) is None


def test_variation_names_an_unsteady_rank() -> None:
    steady = rate_of(_samples(0.0, 0.1, 101, 10.0), 0.0)
    bursty = rate_of([Sample(i * 0.1, 40.0 if (i // 20) % 2 else 1.0) for i in range(101)], 0.0)
    assert steady is not None and steady.variation is not None and steady.variation < 0.05
    assert bursty is not None and bursty.variation is not None and bursty.variation > 0.5


# -- shares and notes -------------------------------------------------------------------


def test_shares_are_proportional_beyond_noise_and_even_within() -> None:
    split, equal = shares([200.0, 100.0])
    assert split == pytest.approx([2 / 3, 1 / 3]) and not equal
    split, equal = shares([100.0, 100.0 * (NOISE_RATIO - 0.01), 100.0])
    assert split == pytest.approx([1 / 3] * 3) and equal
    with pytest.raises(ValueError):
        shares([1.0, 0.0])
    assert speedup([200.0, 100.0]) == pytest.approx(1.5)  # the 1 vs 0.5 speeds


def test_equal_performance_is_the_seeds_overhead_bound_note() -> None:
    cal = build_calibration(
        _measured(("w0", 0, 0.85), ("w1", 0, 0.85), ("w2", 0, 0.86), ("w3", 0, 0.84)),
        hosts=["w0", "w1", "w2", "w3"],
        job_id="j",
        seconds=120,
        script=None,
        workload="reference",
    )
    assert cal.workload_distribution == {f"w{i}": 0.25 for i in range(4)}
    assert cal.measured_performance["w2"] == pytest.approx(0.86)
    assert "Equal performance measured across all workers" in cal.calibration_notes
    assert "overhead-bound, not compute-bound" in cal.calibration_notes


def test_different_speeds_split_in_proportion_per_rank_and_host() -> None:
    cal = build_calibration(
        _measured(("fast", 0, 300.0), ("fast", 1, 300.0), ("slow", 0, 150.0), ("slow", 1, 150.0)),
        hosts=["fast", "slow"],
        job_id="j",
        seconds=30,
        script=["train.py", "--lr", "1"],
        workload="script",
    )
    assert [r.share for r in cal.ranks] == pytest.approx([1 / 3, 1 / 3, 1 / 6, 1 / 6], abs=1e-5)
    assert cal.workload_distribution == pytest.approx({"fast": 2 / 3, "slow": 1 / 3}, abs=1e-5)
    assert cal.measured_performance == pytest.approx({"fast": 600.0, "slow": 300.0})
    assert [r.local_rank for r in cal.host_ranks("slow")] == [0, 1]
    assert cal.weights() == pytest.approx((1 / 3, 1 / 3, 1 / 6, 1 / 6), abs=1e-5)
    notes = cal.calibration_notes
    assert "differs 2.00x" in notes and "fast:0" in notes and "slow:2" in notes
    assert "1.50x faster per epoch" in notes  # 900 / (4 * 150)


def test_notes_name_unsteady_and_rarely_reporting_ranks() -> None:
    ranks = [
        MeasuredRank("a", 0, 0, Rate(100.0, 1000.0, 10.0, 20, 0.4)),
        MeasuredRank("b", 1, 0, Rate(50.0, 100.0, 10.0, 2, None)),
    ]
    notes = build_calibration(
        ranks, hosts=["a", "b"], job_id="j", seconds=10, script=None, workload="reference"
    ).calibration_notes
    assert "Unsteady throughput on a:0 (±40%)" in notes
    assert "Few reports from b:1" in notes


# -- the file ---------------------------------------------------------------------------


def _calibration() -> Calibration:
    return build_calibration(
        _measured(("tb1", 0, 400.0), ("tb2", 0, 200.0)),
        hosts=["tb1", "tb2"],
        job_id="calibrate-1",
        seconds=30,
        script=None,
        workload="reference",
    )


def test_file_round_trip_in_the_seeds_shape(tmp_path: Path) -> None:
    cal = _calibration()
    path = save_calibration(cal, tmp_path / "sub" / "calibration.json")
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    doc = json.loads(path.read_text())
    inner = doc["hardware_calibration"]
    for key in ("measured_performance", "workload_distribution", "calibration_notes"):
        assert key in inner
    for key in ("when", "hosts", "ranks", "script", "seconds"):
        assert key in inner
    assert load_calibration(path) == cal


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("{nope", "is not JSON (line 1"),
        ('{"measured_performance": {}}', "no 'hardware_calibration' object"),
        ('{"hardware_calibration": {"measured_performance": {}}}', "workload_distribution"),
    ],
)
def test_bad_files_are_config_errors_naming_the_file(
    tmp_path: Path, text: str, expected: str
) -> None:
    path = tmp_path / "cal.json"
    path.write_text(text)
    with pytest.raises(ConfigError) as info:
        load_calibration(path)
    assert info.value.option == "--calibration"
    assert str(path) in str(info.value) and expected in str(info.value)


def test_a_missing_file_says_to_calibrate(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="not found \\(run corral calibrate first\\)"):
        load_calibration(tmp_path / "none.json")


# -- weights for a run ------------------------------------------------------------------


def test_weights_follow_the_planned_ranks(tmp_path: Path) -> None:
    path = save_calibration(_calibration(), tmp_path / "c.json")
    assert resolve_weights(path, _cluster("tb1", "tb2"), None) == pytest.approx((2 / 3, 1 / 3))
    # hosts in another order: weights follow the hosts, not the file's order
    assert resolve_weights(path, _cluster("tb2", "tb1"), 1) == pytest.approx((1 / 3, 2 / 3))
    # a subset keeps the relative speeds (here one host: all of it)
    assert resolve_weights(path, _cluster("tb2"), None) == (1.0,)
    # a host written by address in the hostfile matches too
    by_address = Cluster((Host("gpu-a", address="tb1"), Host("tb2")))
    assert resolve_weights(path, by_address, None) == pytest.approx((2 / 3, 1 / 3))


def test_a_host_missing_from_the_file_is_named(tmp_path: Path) -> None:
    path = save_calibration(_calibration(), tmp_path / "c.json")
    with pytest.raises(ConfigError) as info:
        resolve_weights(path, _cluster("tb1", "tb3"), None)
    text = str(info.value)
    assert info.value.option == "--calibration"
    assert "host tb3 is not in the calibration (measured: tb1, tb2)" in text
    assert "re-run `corral calibrate --hosts hosts.txt`" in text


def test_another_rank_count_than_measured_is_named() -> None:
    with pytest.raises(ConfigError) as info:
        resolve_weights(_calibration(), _cluster("tb1", "tb2"), 2)
    assert "host tb1 ran 1 rank(s) in the calibration but this run plans 2 there" in str(info.value)
    assert "--nproc-per-node 2" in str(info.value)


def test_planned_ranks_use_slots_or_nproc() -> None:
    cluster = Cluster((Host("a", slots=2), Host("b", slots=1)))
    assert [(h.name, i) for h, i in planned_ranks(cluster, None)] == [("a", 0), ("a", 1), ("b", 0)]
    assert len(planned_ranks(cluster, 3)) == 6


def test_options_are_checked() -> None:
    with pytest.raises(ConfigError, match="--seconds"):
        CalibrateOptions(seconds=0)
    with pytest.raises(ConfigError, match="--threads"):
        CalibrateOptions(threads=0)


# -- the measurement's collector --------------------------------------------------------


def _progress(rank: int, host: str, time: float, **metrics: float) -> Progress:
    return Progress(job_id="j", time=time, host=host, rank=rank, step=1, metrics=metrics)


def test_collector_stops_the_job_seconds_after_every_rank_reported() -> None:
    stopped: list[float] = []

    async def scenario() -> _Collector:
        loop = asyncio.get_running_loop()
        collector = _Collector({0: ("a", 0), 1: ("b", 0)}, seconds=0.2)
        collector.stop = lambda: stopped.append(loop.time())
        collector.on_event(_progress(0, "a", 1.0, examples=10))
        await asyncio.sleep(0.3)
        assert stopped == []  # rank 1 has not reported yet: the window has not begun
        started = loop.time()
        for i in range(1, 40):  # busy (part of a step) is not what a calibration measures
            collector.on_event(_progress(1, "b", 1.0 + i, examples=5, busy=0.01))
            collector.on_event(_progress(0, "a", 1.0 + i, examples=10, busy=0.5))
        await asyncio.sleep(0.4)
        assert len(stopped) == 1 and stopped[0] - started >= 0.19
        return collector

    collector = asyncio.run(scenario())
    assert collector.stopping
    collector.on_event(_progress(0, "a", 99.0, examples=1e6))  # after the stop: ignored
    rates = {m.rank: m.rate.examples_per_s for m in collector.measured()}
    assert rates[0] == pytest.approx(10.0) and rates[1] == pytest.approx(5.0)


def test_collector_names_silent_and_too_rare_ranks() -> None:
    collector = _Collector({0: ("a", 0), 1: ("b", 0)}, seconds=10)

    async def feed() -> None:  # the engine calls subscribers on its event loop
        collector.on_event(_progress(0, "a", 1.0, examples=10))
        collector.on_event(_progress(0, "a", 2.0, loss=0.5))  # no examples: not a sample
        assert collector.silent() == [1]
        collector.on_event(_progress(1, "b", 1.5, examples=10))
        collector.cancel()

    asyncio.run(feed())
    with pytest.raises(JobFailed, match="rank 0 on a sent 1 report"):
        collector.measured()


def _ended_early(reports: dict[int, list[tuple[float, float]]]) -> _Collector:
    """A collector fed ``rank: [(time, examples)]`` by a script that exited before
    the window was over (the job ended: the timer is cancelled, nothing stopped it)."""
    collector = _Collector({0: ("a", 0), 1: ("b", 0)}, seconds=30)

    async def feed() -> None:
        for rank, samples in reports.items():
            for time, examples in samples:
                collector.on_event(_progress(rank, "ab"[rank], time, examples=examples))
        collector.cancel()

    asyncio.run(feed())
    return collector


def test_a_script_that_ends_first_is_measured_per_rank() -> None:
    # rank 1 is done before rank 0 starts (ranks run alone): no common window to cut
    collector = _ended_early(
        {
            1: [(10.0 + i * 0.01, 4) for i in range(60)],
            0: [(20.0 + i * 0.02, 4) for i in range(60)],
        }
    )
    rates = {m.rank: m.rate for m in collector.measured()}
    assert rates[1].examples_per_s == pytest.approx(400.0)
    assert rates[0].examples_per_s == pytest.approx(200.0)
    assert rates[0].reports == rates[1].reports == 54  # each after its own warm-up
    note = collector.early_note()
    assert note is not None
    assert note.startswith("The script ended 11.2 s after its first report, before the 30 s")


def test_a_script_that_ends_too_soon_is_told_why() -> None:
    collector = _ended_early({0: [(1.0, 8), (1.1, 8)], 1: [(1.0, 8)]})
    with pytest.raises(JobFailed) as failed:
        collector.measured()
    text = str(failed.value)
    assert "rank 1 on b sent 1 report(s) with examples, too few to measure" in text
    assert "the script ended 0.1 s after its first report, before the 30 s measuring" in text
    assert "a longer --seconds cannot help" in text and "more steps" in text


def test_the_window_over_keeps_the_seconds_advice() -> None:
    collector = _Collector({0: ("a", 0)}, seconds=1)
    collector.samples[0].append(Sample(1.0, 8))  # one report, then the window was over
    collector.window_start, collector.window_end, collector.stopping = 1.0, 2.0, True
    assert collector.early_note() is None
    with pytest.raises(JobFailed, match="none after the warm-up: report more often, or pass"):
        collector.measured()


def test_a_calibration_plans_no_master_to_wait_for() -> None:
    cluster = Cluster((Host("n0", local=True), Host("n1", local=True)), source="t")
    spec = JobSpec(script="/s.py", launcher="python", job_id="c", run_dir="/tmp/r")
    assert plan_job(spec, cluster)[0].hosts_master  # a job: the ranks' master is probed
    calibrating = replace(spec, env={"CORRAL_CALIBRATE": "1"})
    assert not any(c.hosts_master for c in plan_job(calibrating, cluster))


# -- shipping the reference workload ----------------------------------------------------


def test_the_shell_writer_puts_the_reference_in_place_once(tmp_path: Path) -> None:
    source = REFERENCE.read_text()
    program = _shell_writer(source, "reference-x.py")
    env = {"HOME": str(tmp_path), "PATH": os.environ["PATH"]}
    for _ in range(2):  # the second run keeps the file
        done = subprocess.run(["sh", "-c", program], env=env, capture_output=True, text=True)
        assert done.returncode == 0, done.stderr
    target = tmp_path / ".corral" / "calibrate" / "reference-x.py"
    assert target.read_text() == source
    assert stat.S_IMODE(target.stat().st_mode) == 0o600
    assert stat.S_IMODE(target.parent.stat().st_mode) == 0o700
    assert [p.name for p in target.parent.iterdir()] == ["reference-x.py"]
    with pytest.raises(ValueError):
        _shell_writer("x = 1\nCORRAL_REFERENCE_EOF\n", "r.py")


# -- drift ------------------------------------------------------------------------------


def _stream(monitor: DriftMonitor, until: float, speeds: dict[int, float]) -> None:
    """Both ranks report every second in lockstep (50 examples) with busy seconds
    inversely proportional to their speed, from the monitor's last time on."""
    start = getattr(monitor, "_t", 0.0)
    t = start
    while t < until:
        t += 1.0
        for rank, speed in speeds.items():
            monitor.on_event(_progress(rank, f"h{rank}", t, examples=50, busy=50 / (100 * speed)))
    monitor._t = t  # type: ignore[attr-defined]


def test_drift_warns_once_when_a_rank_slows_and_says_when_it_is_back() -> None:
    said: list[JobEvent] = []
    monitor = DriftMonitor(
        (0.5, 0.5), _cluster("h0", "h1"), None, emit=said.append, window=20, min_seconds=5
    )
    monitor.on_event(AttemptStarted(job_id="j", number=0, hosts=["h0", "h1"], world_size=2))
    _stream(monitor, 30, {0: 1.0, 1: 1.0})
    assert said == []  # equal speeds, equal weights
    _stream(monitor, 60, {0: 1.0, 1: 0.5})  # h1 at half speed
    warnings = [e for e in said if isinstance(e, Message) and e.level == "warning"]
    assert len(warnings) == 2, said  # both shares moved: h0 up, h1 down, each told once
    text = " ".join(w.text for w in warnings)
    assert re.search(r"rank 1 \(h1\) runs \d+% below its calibrated share", text), text
    assert re.search(r"rank 0 \(h0\) runs \d+% above", text) and "pass --rebalance" in text
    ratios = {d.rank: d.ratio for d in monitor.drifts()}  # once the window is all slow
    assert ratios == pytest.approx({0: 1 / 3, 1: -1 / 3}, abs=0.01)
    assert monitor.rebalanced_weights() == pytest.approx((2 / 3, 1 / 3), abs=0.01)
    _stream(monitor, 100, {0: 1.0, 1: 1.0})
    back = [e.text for e in said if isinstance(e, Message) and e.level == "info"]
    assert any("rank 1 (h1) is back within 20%" in t for t in back)


def test_drift_within_the_threshold_is_quiet() -> None:
    said: list[JobEvent] = []
    monitor = DriftMonitor((0.5, 0.5), _cluster("h0", "h1"), None, emit=said.append)
    _stream(monitor, 120, {0: 1.0, 1: 0.85})  # 8% off the share: within 20%
    assert said == [] and monitor.drifting == {}


def test_respec_rebalances_or_remaps_for_the_next_attempt() -> None:
    cluster = _cluster("h0", "h1", "h2")
    spec = JobSpec(script="t.py", workload_weights=(0.25, 0.5, 0.25))
    monitor = DriftMonitor(spec.workload_weights, cluster, None, rebalance=True, min_seconds=1)
    monitor.on_event(AttemptStarted(job_id="j", number=0, hosts=["h0", "h1", "h2"], world_size=3))
    # no live rates yet: the weights are only remapped onto the surviving hosts
    survivors = _cluster("h1", "h2")
    assert monitor.respec(spec, survivors).workload_weights == pytest.approx((2 / 3, 1 / 3))
    monitor.weights = spec.workload_weights
    _stream(monitor, 20, {0: 1.0, 1: 1.0, 2: 2.0})
    assert monitor.respec(spec, cluster).workload_weights == pytest.approx(
        (0.25, 0.25, 0.5), abs=0.01
    )
    assert monitor.respec(JobSpec(script="t.py"), cluster).workload_weights == ()
    live = monitor.live_calibration()
    assert live is not None and live.workload == "live"
    assert resolve_weights(live, cluster, None) == pytest.approx((0.25, 0.25, 0.5), abs=0.01)


def test_the_live_calibration_is_saved_when_the_job_ends(tmp_path: Path) -> None:
    said: list[JobEvent] = []
    target = tmp_path / "runs" / "j" / "calibration-live.json"
    monitor = DriftMonitor(
        (0.5, 0.5), _cluster("h0", "h1"), None, emit=said.append, min_seconds=1, save_to=target
    )
    monitor.on_event(AttemptStarted(job_id="j", number=0, hosts=["h0", "h1"], world_size=2))
    _stream(monitor, 20, {0: 1.0, 1: 0.5})
    monitor.on_event(Finished(job_id="j", state=JobState.SUCCEEDED, exit_code=0, result=None))
    live = load_calibration(target)
    assert live.workload == "live" and live.hosts == ["h0", "h1"]
    assert live.weights() == pytest.approx((2 / 3, 1 / 3), abs=0.01)
    assert any(isinstance(e, Message) and str(target) in e.text for e in said)


def test_nothing_is_saved_without_live_rates(tmp_path: Path) -> None:
    target = tmp_path / "live.json"
    monitor = DriftMonitor((0.5, 0.5), _cluster("h0", "h1"), None, save_to=target)
    monitor.on_event(Finished(job_id="j", state=JobState.FAILED, exit_code=1, result=None))
    assert not target.exists()
