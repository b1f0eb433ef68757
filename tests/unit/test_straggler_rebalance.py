"""A persistent compute straggler feeds ``--rebalance``: the trigger policy (which
stragglers count), the conversion (a node's weight over its slowest rank's ratio) and
the drift monitor's choice at a restart (measured busy rates first)."""

from __future__ import annotations

from typing import Literal

import pytest

from corral.cluster.model import Cluster, Host
from corral.diagnose.stragglers import is_compute_section
from corral.job.drift import (
    MAX_STRAGGLER_CORRECTION,
    DriftMonitor,
    StragglerEvidence,
    straggler_evidence,
    straggler_rates,
)
from corral.job.events import AttemptStarted, JobEvent, Message, Progress, StragglerFound
from corral.plan.spec import JobSpec


def _cluster(*names: str, slots: int = 1) -> Cluster:
    return Cluster(tuple(Host(n, slots=slots) for n in names), source="hosts.txt")


def _straggler(
    host: str = "h1",
    rank: int = 1,
    section: str = "compute",
    ratio: float = 2.0,
    basis: Literal["median", "best"] = "median",
) -> StragglerFound:
    return StragglerFound(
        job_id="j", host=host, rank=rank, section=section, ratio=ratio, basis=basis, span=5, step=9
    )


def _started(monitor: DriftMonitor, *hosts: str, number: int = 0) -> None:
    world = len(monitor.plan) if number == 0 else len(hosts)
    monitor.on_event(AttemptStarted(job_id="j", number=number, hosts=list(hosts), world_size=world))


def _texts(said: list[JobEvent]) -> str:
    return "\n".join(e.text for e in said if isinstance(e, Message))


# -- the trigger policy -----------------------------------------------------------------


def test_only_a_compute_straggler_slower_than_its_peers_is_evidence() -> None:
    found = straggler_evidence(_straggler(ratio=3.0))
    assert found == StragglerEvidence("h1", 1, "compute", 3.0, 9)
    assert found.describe() == "rank 1 on h1, compute 3.0x the median"
    assert straggler_evidence(_straggler(section="compute_fwd")) is not None
    assert straggler_evidence(_straggler(section="wait")) is None  # waiting: never
    assert straggler_evidence(_straggler(section="wait_compute")) is None
    assert straggler_evidence(_straggler(section="data")) is None  # not compute
    assert straggler_evidence(_straggler(section="checkpoint")) is None
    assert straggler_evidence(_straggler(basis="best")) is None  # only slower than itself
    assert is_compute_section("Compute") and not is_compute_section("step")


# -- the conversion ---------------------------------------------------------------------


def test_a_straggling_node_is_divided_by_its_ratio_capped() -> None:
    weights = {("a", 0): 0.25, ("a", 1): 0.25, ("b", 0): 0.25, ("b", 1): 0.25}
    rates = straggler_rates(weights, {"b": 2.0})
    assert rates == {("a", 0): 0.25, ("a", 1): 0.25, ("b", 0): 0.125, ("b", 1): 0.125}
    capped = straggler_rates(weights, {"b": 50.0})
    assert capped[("b", 0)] == pytest.approx(0.25 / MAX_STRAGGLER_CORRECTION)
    assert straggler_rates(weights, {"b": 0.5}) == weights  # never moves work *to* it
    assert straggler_rates(weights, {"gone": 3.0}) == weights
    with pytest.raises(ValueError, match="at least 1"):
        straggler_rates(weights, {}, cap=0.5)


# -- the monitor ------------------------------------------------------------------------


def test_a_straggler_moves_work_away_from_its_node_at_the_restart() -> None:
    said: list[JobEvent] = []
    cluster = _cluster("h0", "h1")
    spec = JobSpec(script="t.py", workload_weights=(0.5, 0.5))
    monitor = DriftMonitor((0.5, 0.5), cluster, None, emit=said.append, rebalance=True)
    _started(monitor, "h0", "h1")
    monitor.on_event(_straggler(ratio=2.0))
    monitor.on_event(_straggler(ratio=1.6))  # named again, less slow: the slowest stays
    monitor.on_event(_straggler(host="h0", rank=0, section="wait", ratio=9.0))  # ignored
    assert set(monitor.stragglers) == {"h1"} and monitor.stragglers["h1"].ratio == 2.0
    assert "moves work away from h1 (--rebalance)" in _texts(said)
    weights = monitor.respec(spec, cluster).workload_weights
    assert weights == pytest.approx((2 / 3, 1 / 3), abs=1e-5)
    assert "rebalanced workload weights from a straggler" in _texts(said)
    # the evidence was used once: a second restart without a new straggler keeps them
    again = monitor.respec(spec, cluster).workload_weights
    assert again == pytest.approx(weights)


def test_the_correction_starts_from_the_current_weights_and_follows_the_hosts() -> None:
    cluster = _cluster("h0", "h1", "h2")
    spec = JobSpec(script="t.py", workload_weights=(0.2, 0.4, 0.4))
    monitor = DriftMonitor(spec.workload_weights, cluster, None, rebalance=True)
    _started(monitor, "h0", "h1", "h2")
    monitor.on_event(_straggler(host="h1", ratio=2.0))
    survivors = _cluster("h1", "h2")  # h0 lost: h1 still pays for its straggler
    assert monitor.respec(spec, survivors).workload_weights == pytest.approx((1 / 3, 2 / 3))


def test_measured_busy_rates_win_over_the_straggler() -> None:
    cluster = _cluster("h0", "h1")
    spec = JobSpec(script="t.py", workload_weights=(0.5, 0.5))
    monitor = DriftMonitor((0.5, 0.5), cluster, None, rebalance=True, min_seconds=1)
    _started(monitor, "h0", "h1")
    for t in range(1, 21):  # h1 at a third of h0's speed, in examples per busy second
        for rank, busy in ((0, 0.25), (1, 0.75)):
            event = Progress(
                job_id="j", time=float(t), host=f"h{rank}", rank=rank, step=t,
                metrics={"examples": 50, "busy": busy},
            )  # fmt: skip
            monitor.on_event(event)
    monitor.on_event(_straggler(ratio=1.5))
    weights = monitor.respec(spec, cluster).workload_weights
    assert weights == pytest.approx((0.75, 0.25), abs=0.01)  # the rates, not 0.6/0.4


def test_without_rebalance_or_with_lockstep_rates_only() -> None:
    cluster = _cluster("h0", "h1")
    spec = JobSpec(script="t.py", workload_weights=(0.5, 0.5))
    said: list[JobEvent] = []
    quiet = DriftMonitor((0.5, 0.5), cluster, None, emit=said.append)  # no --rebalance
    _started(quiet, "h0", "h1")
    quiet.on_event(_straggler(ratio=3.0))
    assert quiet.stragglers == {} and said == []
    assert quiet.respec(spec, cluster).workload_weights == (0.5, 0.5)
    # --rebalance, examples without busy: lockstep rates (equal) show no straggler
    monitor = DriftMonitor((0.5, 0.5), cluster, None, rebalance=True, min_seconds=1)
    _started(monitor, "h0", "h1")
    for t in range(1, 21):
        for rank in (0, 1):
            event = Progress(
                job_id="j", time=float(t), host=f"h{rank}", rank=rank, step=t,
                metrics={"examples": 50},
            )  # fmt: skip
            monitor.on_event(event)
    monitor.on_event(_straggler(ratio=3.0))
    assert monitor.respec(spec, cluster).workload_weights == pytest.approx((0.75, 0.25))


def test_a_new_attempt_forgets_the_last_ones_straggler() -> None:
    cluster = _cluster("h0", "h1")
    spec = JobSpec(script="t.py", workload_weights=(0.5, 0.5))
    monitor = DriftMonitor((0.5, 0.5), cluster, None, rebalance=True)
    _started(monitor, "h0", "h1")
    monitor.on_event(_straggler(ratio=3.0))
    _started(monitor, "h0", "h1", number=1)
    assert monitor.stragglers == {}
    assert monitor.respec(spec, cluster).workload_weights == (0.5, 0.5)
