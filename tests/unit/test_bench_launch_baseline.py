"""``bench_launch.py --baseline SRC``: the code before a change measured in the same
rounds as the change (a third run each round, the order rotating), with its own
corral on ``PYTHONPATH`` and its ratios to the runs by hand and from this corral."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest

BENCH = Path(__file__).resolve().parents[2] / "benchmarks"


@pytest.fixture
def bench(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[ModuleType]:
    monkeypatch.setenv("CORRAL_BENCH_RESULTS", str(tmp_path / "results"))
    monkeypatch.syspath_prepend(str(BENCH))
    for name in ("benchlib", "bench_launch"):
        sys.modules.pop(name, None)
    import bench_launch

    yield bench_launch
    for name in ("benchlib", "bench_launch"):
        sys.modules.pop(name, None)


def test_each_round_runs_the_three_in_a_rotating_order(bench: ModuleType) -> None:
    rounds = [bench._order(n, True) for n in range(3)]
    assert all(sorted(r) == ["base", "corral", "hand"] for r in rounds)
    for position in range(3):  # each method in each position once every three rounds
        assert sorted(r[position] for r in rounds) == ["base", "corral", "hand"]
    assert [bench._order(n, False) for n in range(2)] == [
        ("hand", "corral"),
        ("corral", "hand"),
    ]


def test_the_baseline_is_a_corral_source_folder_and_runs_with_it_first(
    bench: ModuleType, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    checkout = tmp_path / "before"
    (checkout / "src" / "corral").mkdir(parents=True)
    (checkout / "src" / "corral" / "__init__.py").write_text("")
    src = bench.baseline_source(str(checkout))  # a checkout's root: its src
    assert src == checkout / "src"
    with pytest.raises(argparse.ArgumentTypeError, match="no corral package"):
        bench.baseline_source(str(tmp_path / "results"))
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(bench.ROOT / "src"), "/elsewhere"]))
    path = bench.source_env(src)["PYTHONPATH"].split(os.pathsep)
    assert path == [str(src), "/elsewhere"]  # this checkout's corral is not on it


def test_the_baseline_is_compared_round_by_round(bench: ModuleType) -> None:
    def runs(*seconds: float) -> list[dict[str, float]]:
        return [{"first_step_s": s, "cpu_s": 1.0} for s in seconds]

    hand, corral, base = runs(2.0, 4.0, 3.0), runs(2.2, 4.0, 3.3), runs(2.4, 5.0, 3.3)
    compared = bench._against_baseline(corral, hand, base, "local:2x1")
    assert compared["first_step_s"] == 3.3
    assert compared["paired_ratio"] == pytest.approx(1.2)  # 1.2, 1.25, 1.1
    assert compared["corral_to_baseline"] == pytest.approx(2.2 / 2.4)  # 0.917, 0.8, 1.0
    assert len(compared["metrics"]) == 2
    assert bench._against_baseline(corral, hand, [], "local:2x1") == {}
