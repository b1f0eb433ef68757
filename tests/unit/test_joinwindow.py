"""The smoke test's join window is sized for the machines the ranks share (not a
constant), and when it is over the verdict counts who joined and names the late."""

from __future__ import annotations

from typing import Any

import pytest

from corral.checks import smoke as smoke_mod
from corral.checks.joinwindow import (
    IMPORT_CPU_S,
    MAX_WINDOW_S,
    SAFETY,
    SETUP_S,
    RunnerFacts,
    host_cap,
    join_window,
    late_summary,
)
from corral.checks.result import Status
from corral.cluster.model import Host


def test_sixty_four_hosts_on_two_cores_get_a_window_for_32_waves_of_imports() -> None:
    same = {f"tb{i}": RunnerFacts(1, "boot-1", 2) for i in range(1, 65)}
    window = join_window(30.0, same)
    assert window == pytest.approx(SETUP_S + SAFETY * IMPORT_CPU_S * 32)
    assert window > 30.0
    assert window <= host_cap(30.0, 64)


def test_separate_machines_keep_the_base_window() -> None:
    spread = {f"gpu{i}": RunnerFacts(8, f"boot-{i}", 64) for i in range(64)}
    assert join_window(30.0, spread) == 30.0
    assert join_window(30.0, {}) == 30.0


def test_the_busiest_machine_decides_and_unknown_machines_stand_alone() -> None:
    facts = {
        "a": RunnerFacts(4, "m1", 2),  # 2 waves
        "b": RunnerFacts(4, "m1", 2),  # m1: 8 ranks on 2 CPUs: 4 waves
        "c": RunnerFacts(6, None, None),  # its own machine, 1 CPU: 6 waves
    }
    assert join_window(1.0, facts) == pytest.approx(SETUP_S + SAFETY * IMPORT_CPU_S * 6)
    assert join_window(1.0, {"x": RunnerFacts(10_000, "m", 1)}) == MAX_WINDOW_S
    assert host_cap(30.0, 3) == 30.0 and host_cap(1.0, 10_000) == MAX_WINDOW_S


def test_late_summary_counts_and_names() -> None:
    joined = [f"tb{i}" for i in range(1, 13)]
    late = [f"tb{i}" for i in range(13, 65)]
    text = late_summary(joined, late, 101.2, [6.0, 8.0, 30.0])
    assert text == (
        "12 of 64 hosts joined within 101 s; late: tb13, tb14, tb15, tb16, tb17, tb18, "
        "tb19, tb20 (+44 more); torch import took 8.0 s (median, up to 30.0 s) where it "
        "finished"
    )
    assert (
        late_summary(joined, late, 101.0, [], named=False) == "12 of 64 hosts joined within 101 s"
    )


def _smoke(joined: int, total: int) -> Any:
    runs = []
    for i in range(total):
        run = smoke_mod._HostRun(
            host=Host(name=f"tb{i}", address=f"10.0.0.{i}"), ranks=[i], env={}, python=None
        )
        run.proc = object()  # type: ignore[assignment]  # started
        if i < joined:
            run.joined.add(i)
            run.import_s.append(5.0 + i)
        runs.append(run)
    s = smoke_mod._Smoke(
        transport=object(),  # type: ignore[arg-type]
        runs=runs,
        args={"master_addr": "tb0", "port": 29500, "iterations": 5},
        join_deadline=0.0,
        deadline=0.0,
    )
    s.timed_out = True
    smoke_mod._late(s)
    return s


def test_the_verdict_after_the_window_counts_who_joined_and_names_the_late() -> None:
    result = smoke_mod._report(_smoke(12, 64), 101.0, "gloo", 4)
    assert result.status is Status.FAIL
    assert result.summary.startswith("12 of 64 hosts joined within 101 s; late: tb12, tb13")
    assert result.error is not None and result.error.startswith("12 of 64 hosts joined")
    assert "torch import took 10.5 s (median, up to 16.0 s)" in result.error
    assert result.hosts["tb0"].status is Status.PASS
    assert result.hosts["tb40"].detail.startswith("never joined: rank 40 did not join within 101 s")
    assert result.data["joined_hosts"] == [f"tb{i}" for i in range(12)]
    assert result.data["join_window_s"] == 101.0
    assert result.data["import_s"]["tb3"] == 8.0


def test_a_few_late_hosts_are_each_named_with_the_count() -> None:
    result = smoke_mod._report(_smoke(2, 3), 30.0, "gloo", 4)
    assert result.error is not None
    assert result.error.startswith("tb2: never joined: rank 2 did not join within 30 s")
    assert "2 of 3 hosts joined within 30 s" in result.error
