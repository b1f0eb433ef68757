"""Straggler scores (pure), sdk.section timings and how they travel with sdk.report."""

from __future__ import annotations

import json
import sys
import time
import types
from typing import Any

import pytest

from corral import sdk
from corral.agent.messages import ReportsMessage, forwarded, parse_message
from corral.diagnose.stragglers import (
    Straggler,
    StragglerPolicy,
    StragglerScores,
    is_wait_section,
    median_ratios,
)
from corral.sdk import _report, _section
from tests.conftest import require_torch
from tests.unit.test_sdk_report import ControlServer, control_server  # noqa: F401

# -- scores -----------------------------------------------------------------------------


def _feed(
    scores: StragglerScores, steps: range, values: dict[int, float], section: str = "compute"
) -> list[Straggler]:
    found: list[Straggler] = []
    for step in steps:
        for rank, value in values.items():
            found += scores.observe(f"local-{rank}", rank, step, {section: value})
    return found


def test_a_slow_rank_is_named_once_against_the_median() -> None:
    scores = StragglerScores(StragglerPolicy(threshold=1.5, reports=5))
    assert _feed(scores, range(1, 11), {0: 0.05, 1: 0.05, 2: 0.05}) == []
    found = _feed(scores, range(11, 31), {0: 0.05, 1: 0.25, 2: 0.05})
    assert len(found) == 1
    named = found[0]
    assert (named.host, named.rank, named.section, named.basis) == (
        "local-1",
        1,
        "compute",
        "median",
    )
    assert named.step == 15 and named.span == 5
    assert named.ratio == pytest.approx(5.0)
    assert named.message() == "straggler: rank 1 on local-1, compute 5.0x the median for 5 steps"
    assert scores.ratios()[("local-1", 1)]["compute"] == pytest.approx(5.0)
    assert scores.named == found


def test_equal_ranks_and_jitter_name_nobody() -> None:
    scores = StragglerScores(StragglerPolicy(threshold=1.5, reports=5))
    jitter = [0.9, 1.1, 1.0, 1.6, 0.95, 1.7, 1.0, 1.05]  # 1.6x now and then, never 5 in a row
    found = []
    for step, factor in enumerate(jitter * 4):
        found += scores.observe("local-0", 0, step, {"compute": 0.05})
        found += scores.observe("local-1", 1, step, {"compute": 0.05 * factor})
    assert found == []


def test_tiny_sections_need_an_absolute_excess() -> None:
    scores = StragglerScores(StragglerPolicy(threshold=1.5, reports=2, min_excess=0.005))
    assert _feed(scores, range(10), {0: 0.0001, 1: 0.0009}) == []  # 9x but under 5 ms


def test_own_best_names_a_rank_that_slowed_only_when_above_its_peers() -> None:
    policy = StragglerPolicy(threshold=1.5, reports=3, warmup=2)
    scores = StragglerScores(policy)
    # the whole job slows down together: nobody is named against its own best
    assert _feed(scores, range(1, 6), {0: 0.1, 1: 0.1}) == []
    assert _feed(scores, range(6, 12), {0: 0.3, 1: 0.3}) == []
    # a single rank (no peers) that slows down is named against its own best
    alone = StragglerScores(policy)
    found = _feed(alone, range(1, 6), {0: 0.1}) + _feed(alone, range(6, 12), {0: 0.2})
    assert [(s.basis, s.span, round(s.ratio, 1)) for s in found] == [("best", 3, 2.0)]
    assert found[0].message().endswith("compute 2.0x its own best for 3 steps")


def test_wait_sections_are_never_scored_and_named_again_after_recovery() -> None:
    scores = StragglerScores(StragglerPolicy(threshold=1.5, reports=2))
    assert is_wait_section("wait") and is_wait_section("Wait_data")
    assert not is_wait_section("compute")
    assert _feed(scores, range(10), {0: 0.5, 1: 0.01}, section="wait") == []
    first = _feed(scores, range(10, 14), {0: 0.05, 1: 0.2})
    assert len(first) == 1
    assert _feed(scores, range(14, 18), {0: 0.05, 1: 0.05}) == []  # recovered
    again = _feed(scores, range(18, 22), {0: 0.05, 1: 0.2})
    assert [s.step for s in again] == [19]


def test_reports_without_steps_count_reports_and_forget_drops_a_rank() -> None:
    scores = StragglerScores(StragglerPolicy(threshold=2.0, reports=3))
    found: list[Straggler] = []
    for _ in range(3):
        found += scores.observe("h", 0, None, {"compute": 0.1})
        found += scores.observe("h", 1, None, {"compute": 0.5})
    assert [(s.span, s.unit) for s in found] == [(3, "reports")]
    assert found[0].message().endswith("for 3 reports")
    scores.forget([("h", 1)])
    assert ("h", 1) not in scores.ratios()


def test_median_ratios_and_policy_checks() -> None:
    ratios = median_ratios({("a", 0): 1.0, ("b", 1): 1.0, ("c", 2): 3.0})
    assert ratios[("c", 2)] == pytest.approx(3.0) and ratios[("a", 0)] == pytest.approx(0.5)
    assert median_ratios({("a", 0): 2.0}) == {("a", 0): 1.0}
    with pytest.raises(ValueError, match="threshold must be more than 1"):
        StragglerPolicy(threshold=1.0)
    with pytest.raises(ValueError, match="reports must be at least 1"):
        StragglerPolicy(reports=0)


# -- sdk.section ------------------------------------------------------------------------


def test_section_sends_mean_seconds_with_the_next_report(control_server: ControlServer) -> None:  # noqa: F811
    _section.drain()
    for _ in range(2):
        with sdk.section("compute"):
            time.sleep(0.02)
    with sdk.section("wait"):
        pass
    sdk.report(1, 10, loss=1.0)
    sdk.report(2, 10)
    with sdk.section("compute"):
        pass
    sdk.report(3, 10)
    first, second, third = control_server.wait_reports(3)
    assert set(first["sections"]) == {"compute", "wait"}
    assert 0.02 <= first["sections"]["compute"] < 5.0
    assert "sections" not in second  # nothing timed since: nothing sent
    assert set(third["sections"]) == {"compute"}
    assert third["sections"]["compute"] < first["sections"]["compute"]  # its own timing
    # what the agent accepts and forwards
    line = control_server.wait_lines(2)[1]
    message = parse_message(line.encode())
    assert isinstance(message, ReportsMessage)
    assert forwarded(message, 3, now=1.0)[0]["sections"] == first["sections"]


def test_section_names_are_checked_and_exceptions_still_time() -> None:
    _section.drain()
    with pytest.raises(ValueError, match="section name"), sdk.section(""):
        pass
    with pytest.raises(KeyError), sdk.section("compute"):
        raise KeyError("boom")
    assert set(_section.drain()) == {"compute"}


def test_agent_refuses_bad_sections() -> None:
    line = {"type": "progress", "step": 1, "sections": {"compute": -1.0}}
    with pytest.raises(ValueError, match=r"sections\.compute"):
        parse_message(json.dumps(line).encode())
    many = {"type": "progress", "step": 1, "sections": {f"s{i}": 0.1 for i in range(40)}}
    with pytest.raises(ValueError, match="sections"):
        parse_message(json.dumps(many).encode())


class _FakeEvent:
    """A CUDA event as the seam sees it: done once the fake GPU passed it."""

    clock = 0.0
    gpu_done_until = 0.0
    made = 0

    def __init__(self, enable_timing: bool = False) -> None:
        assert enable_timing
        self.at = 0.0
        _FakeEvent.made += 1

    def record(self) -> None:
        _FakeEvent.clock += 0.5
        self.at = _FakeEvent.clock

    def query(self) -> bool:
        return self.at <= _FakeEvent.gpu_done_until

    def elapsed_time(self, end: _FakeEvent) -> float:
        return (end.at - self.at) * 1000.0


@pytest.fixture
def fake_cuda(monkeypatch: pytest.MonkeyPatch) -> list[bool]:
    """torch with CUDA initialised, its events :class:`_FakeEvent`; the synchronize
    calls made (there must be none)."""
    synced: list[bool] = []
    cuda = types.SimpleNamespace(
        is_available=lambda: True,
        is_initialized=lambda: True,
        Event=_FakeEvent,
        synchronize=lambda: synced.append(True),
    )
    monkeypatch.setitem(sys.modules, "torch", types.SimpleNamespace(cuda=cuda))
    monkeypatch.setattr(_section, "_cuda_event", None)  # what this process knew of CUDA
    monkeypatch.setattr(_section, "_free_events", [])
    _section.drain()
    _FakeEvent.clock, _FakeEvent.gpu_done_until, _FakeEvent.made = 0.0, 0.0, 0
    return synced


def test_cuda_sections_record_events_and_read_them_lazily(fake_cuda: list[bool]) -> None:
    synced = fake_cuda
    with sdk.section("compute"):  # events at 0.5 and 1.0
        pass
    with sdk.section("compute"):  # events at 1.5 and 2.0
        pass
    assert _section.drain() == {}  # the GPU has not passed them: nothing read, no sync
    _FakeEvent.gpu_done_until = 1.0
    assert _section.drain() == {"compute": pytest.approx(0.5)}  # the first pair only
    _FakeEvent.gpu_done_until = 9.0
    assert _section.drain() == {"compute": pytest.approx(0.5)}  # the second, a report later
    with sdk.section("compute", cuda=False):
        pass
    assert _section.drain()["compute"] < 0.5  # the CPU clock when asked
    assert synced == []


def test_ddp_hook_times_compute_and_wait(tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    torch = require_torch()
    import torch.distributed as dist

    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    store = dist.FileStore(str(tmp_path / "store"), 1)
    dist.init_process_group("gloo", store=store, rank=0, world_size=1)
    try:
        model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(4, 2))
        assert sdk.straggler_hook(model) is model
        _section.drain()
        for _ in range(3):
            time.sleep(0.01)
            model(torch.randn(8, 4)).sum().backward()
        timed = _section.drain()
        assert set(timed) == {"compute", "wait"}
        assert timed["compute"] >= 0.01  # between the end of one all-reduce and the next
    finally:
        dist.destroy_process_group()


def test_cuda_sections_go_with_their_report_and_reuse_read_events(
    fake_cuda: list[bool],
    control_server: ControlServer,  # noqa: F811
) -> None:
    _FakeEvent.gpu_done_until = 1e9  # the GPU keeps up: each pair is done when read
    for step in range(1, 201):
        with sdk.section("compute"):  # 0.5 s of fake GPU time each
            pass
        sdk.report(step)
        if step % 20 == 0:
            _report.flush_reports()  # the sender reads the pairs, then reuses them
    reports = control_server.wait_reports(200)
    assert [r["step"] for r in reports] == list(range(1, 201))
    assert all(r["sections"] == {"compute": pytest.approx(0.5)} for r in reports)
    assert _FakeEvent.made <= 2 * 20 + 2  # not two new events a step
    assert fake_cuda == []  # never a synchronize


def test_section_as_a_decorator_times_each_call() -> None:
    _section.drain()

    @sdk.section("compute", cuda=False)
    def work(x: int) -> int:
        time.sleep(0.01)
        return x + 1

    assert [work(1), work(2)] == [2, 3]
    assert _section.drain()["compute"] >= 0.01


def test_each_report_carries_the_mean_of_each_section_since_the_one_before(
    control_server: ControlServer,  # noqa: F811
) -> None:
    _section.drain()
    sdk.report(0)
    _section.records.extend(("compute", 100, "compute", 300, "wait", 50))  # name, ns
    sdk.report(1)
    _section.records.extend(("compute", 70))
    sdk.report(2)
    sdk.report(3)
    first, second, third = control_server.wait_reports(4)[1:]
    assert first["sections"] == {"compute": pytest.approx(200e-9), "wait": pytest.approx(50e-9)}
    assert second["sections"] == {"compute": pytest.approx(70e-9)}
    assert "sections" not in third
