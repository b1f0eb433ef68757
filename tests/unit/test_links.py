"""The link matrix's pure parts: the round-robin schedule, the time budget, the
scoring that names the host behind slow links, the check's result, the heatmap."""

from __future__ import annotations

import io
import itertools

import pytest
from rich.console import Console
from typer.testing import CliRunner

from corral.checks.links import result_for
from corral.checks.result import Status
from corral.cli.main import _register, app
from corral.diagnose.links import (
    LinkBudget,
    LinkMatrix,
    LinkThresholds,
    PairMeasure,
    RingMeasure,
    busbw,
    round_robin,
    score,
)
from corral.diagnose.links_render import grid, grid_json, heatmap, level
from corral.errors import ConfigError

_register()


@pytest.mark.parametrize("n", range(2, 10))
def test_round_robin_pairs_every_host_with_every_other_once_one_pair_at_a_time(n: int) -> None:
    hosts = [f"h{i}" for i in range(n)]
    rounds = round_robin(hosts)
    assert len(rounds) == (n - 1 if n % 2 == 0 else n)
    seen = [frozenset(p) for r in rounds for p in r]
    assert sorted(seen, key=sorted) == sorted(
        (frozenset(p) for p in itertools.combinations(hosts, 2)), key=sorted
    )
    for r in rounds:
        busy = [h for p in r for h in p]
        assert len(busy) == len(set(busy))  # each host in one pair at a time


def test_round_robin_edge_cases() -> None:
    assert round_robin(["a"]) == []
    assert round_robin([]) == []
    with pytest.raises(ValueError, match="duplicate"):
        round_robin(["a", "a"])


def test_budget_shares_the_time_and_caps_each_direction() -> None:
    budget = LinkBudget(seconds=12.0)
    assert budget.per_direction(3) == 0.5  # capped: 3 rounds, 7 slots
    eight = budget.per_direction(8)  # 7 rounds, both ways, plus the ring
    assert eight == 0.5 and 15 * eight <= 12.0
    assert LinkBudget(seconds=3.0).per_direction(8) == pytest.approx(3.0 / 15)
    assert LinkBudget(seconds=1.0).per_direction(64) == 0.05  # the floor
    with pytest.raises(ValueError):
        LinkBudget(seconds=0)


def test_busbw_follows_nccl_tests() -> None:
    assert busbw(10.0, 2) == 10.0
    assert busbw(10.0, 4) == 15.0
    assert busbw(10.0, 0) == 0.0


def _matrix(values: dict[tuple[str, str], float], hosts: list[str]) -> LinkMatrix:
    pairs = [PairMeasure(a, b, v, v * 1.05, 0.1) for (a, b), v in values.items()]
    return LinkMatrix(hosts=hosts, pairs=pairs, rounds=len(round_robin(hosts)))


THREE = ["tb1", "tb2", "tb3"]


def test_the_throttled_host_is_named_not_its_peers() -> None:
    # tb2 behind a 10x throttle: 2 of 3 pairs are slow, the median pair is slow too
    m = _matrix({("tb1", "tb2"): 0.1, ("tb1", "tb3"): 1.0, ("tb2", "tb3"): 0.1}, THREE)
    s = score(m)
    assert s.reference_gbs == pytest.approx(1.0)
    assert s.culprits == ["tb2"]
    assert s.suspects == []
    assert s.hosts["tb2"][0] == "culprit"
    assert "2 of 2 links slow" in s.hosts["tb2"][1] and "to tb1, tb3" in s.hosts["tb2"][1]
    assert s.hosts["tb1"] == ("ok", s.hosts["tb1"][1])
    assert "slow only to tb2" in s.hosts["tb1"][1]


def test_a_loaded_but_healthy_network_passes() -> None:
    m = _matrix({("tb1", "tb2"): 0.5, ("tb1", "tb3"): 1.4, ("tb2", "tb3"): 0.9}, THREE)
    s = score(m)
    assert s.slow == [] and s.culprits == [] and s.suspects == []


def test_one_slow_pair_without_a_culprit_names_both_ends_as_suspects() -> None:
    hosts = ["a", "b", "c", "d"]
    values = {p: 2.0 for p in itertools.combinations(hosts, 2)}
    values[("a", "b")] = 0.1
    s = score(_matrix(values, hosts))
    assert s.culprits == []
    assert s.suspects == ["a", "b"]
    assert s.slow == [("a", "b")]
    assert "link to b slow" in s.hosts["a"][1]


def test_the_absolute_floor_and_failed_pairs() -> None:
    m = _matrix({("a", "b"): 0.5}, ["a", "b"])
    assert score(m).culprits == []  # relative to itself: never slow
    assert score(m, LinkThresholds(min_gbs=1.0)).culprits == ["a", "b"]
    broken = LinkMatrix(
        hosts=THREE,
        pairs=[
            PairMeasure("tb1", "tb2", error="tb2: cannot connect"),
            PairMeasure("tb1", "tb3", 1.0, 1.0),
            PairMeasure("tb2", "tb3", error="tb2: cannot connect"),
        ],
        host_errors={"tb2": "cannot connect"},
    )
    s = score(broken)
    assert s.culprits == ["tb2"]
    assert s.hosts["tb2"] == ("culprit", "not measured: cannot connect")


def test_thresholds_are_validated() -> None:
    with pytest.raises(ValueError):
        LinkThresholds(min_ratio=1.5)
    with pytest.raises(ValueError):
        LinkThresholds(min_gbs=-1)


def test_the_check_fails_naming_the_culprit_or_warns_when_asked() -> None:
    m = _matrix({("tb1", "tb2"): 0.01, ("tb1", "tb3"): 1.0, ("tb2", "tb3"): 0.01}, THREE)
    m.interfaces = {"tb2": "eth0"}
    res = result_for(m, LinkThresholds())
    assert res.status is Status.FAIL
    assert res.hosts["tb2"].status is Status.FAIL
    assert res.hosts["tb1"].status is Status.PASS
    assert res.error is not None and res.error.startswith("slow links point at tb2")
    assert res.fix_command == "corral exec --hosts tb2 -- ip -s link show dev eth0"
    assert res.data["score"]["culprits"] == ["tb2"]
    assert res.data["grid"][0][1]["level"] == "slow"
    warned = result_for(m, LinkThresholds(fail=False))
    assert warned.status is Status.WARN and warned.warning is not None
    healthy = _matrix({("tb1", "tb2"): 1.0, ("tb1", "tb3"): 1.1, ("tb2", "tb3"): 0.9}, THREE)
    ok = result_for(healthy, LinkThresholds())
    assert ok.status is Status.PASS and "3 pairs in 3 rounds" in ok.summary


def test_the_matrix_round_trips_through_json() -> None:
    m = _matrix({("tb1", "tb2"): 0.01, ("tb1", "tb3"): 1.0, ("tb2", "tb3"): 0.01}, THREE)
    m.ring = RingMeasure((("tb1", "tb2", 0.5), ("tb2", "tb3", 0.01), ("tb3", "tb1", 0.4)))
    back = LinkMatrix.from_json(m.to_json())
    assert back.to_json() == m.to_json()
    assert back.ring is not None and back.ring.busbw_gbs == 0.01
    assert back.ring.slowest == ("tb2", "tb3")


def test_grid_levels_and_the_heatmap() -> None:
    m = _matrix({("tb1", "tb2"): 0.01, ("tb1", "tb3"): 1.0, ("tb2", "tb3"): 0.5}, THREE)
    s = score(m)
    cells = grid(m, s)
    assert [c.level for c in cells[0]] == ["self", "slow", "good"]
    assert cells[1][0].gbs == pytest.approx(0.0105)  # tb2 -> tb1 is b -> a
    assert cells[1][2].level == "fair"
    assert level(None, 1.0, 0.3) == "error"
    doc = grid_json(m, s)
    assert doc[2][0] == {
        "from": "tb3",
        "to": "tb1",
        "gbs": 1.05,
        "level": "good",
        "text": "1.05 GB/s",
    }
    assert s.suspects == ["tb1", "tb2"] and s.culprits == []
    bad = _matrix({("tb1", "tb2"): 0.01, ("tb1", "tb3"): 1.0, ("tb2", "tb3"): 0.01}, THREE)
    out = io.StringIO()
    Console(file=out, width=120, color_system=None).print(heatmap(bad, score(bad)))
    text = out.getvalue()
    assert "tb2 ✗" in text and "tb1 ✗" not in text
    assert "10.5 MB/s" in text and "reference 1 GB/s" in text


def test_cli_names_a_bad_links_option() -> None:
    result = CliRunner().invoke(
        app, ["check", "--hosts", "local:2", "--links", "--links-min-ratio", "1.5"]
    )
    assert isinstance(result.exception, ConfigError)  # the CLI's main prints it, exit 2
    assert str(result.exception) == "--links-min-ratio: must be in [0, 1) (got 1.5)"


def test_run_check_links_reaches_the_preflight_checklist() -> None:
    from corral.cluster import load_cluster
    from corral.job.build import build_job
    from corral.job.describe import JobOptions
    from corral.job.preflight import checklist_options
    from corral.transport.options import SshOptions

    spec, pol = build_job(
        JobOptions(command=("train.py",), check_links=True, links_min_gbs=0.5, links_warn_only=True)
    )
    opts = checklist_options(pol.checks, spec, load_cluster("local:2"), SshOptions(), None, None)
    assert (opts.links, opts.links_min_gbs, opts.links_fail) == (True, 0.5, False)
    assert not checklist_options(
        build_job(JobOptions(command=("train.py",)))[1].checks,
        spec,
        load_cluster("local:2"),
        SshOptions(),
        None,
        None,
    ).links
    with pytest.raises(ConfigError, match="--links-min-ratio"):
        build_job(JobOptions(command=("train.py",), links_min_ratio=2.0))


def test_a_pair_found_slow_is_measured_again_and_keeps_its_better_measure() -> None:
    from corral.diagnose.links import PairMeasure, better, to_recheck

    hosts = ["a", "b", "c"]
    fast = PairMeasure("a", "b", ab_gbs=2.0, ba_gbs=2.2, rtt_ms=0.03)
    dipped = PairMeasure("a", "c", ab_gbs=0.5, ba_gbs=2.1, rtt_ms=0.05)  # busy while measured
    broken = PairMeasure("b", "c", error="c: refused")
    assert to_recheck(hosts, [fast, dipped, broken]) == [dipped]  # not the fast, not the error
    again = PairMeasure("a", "c", ab_gbs=2.0, ba_gbs=1.9, rtt_ms=0.02)
    assert better(dipped, again) == PairMeasure("a", "c", ab_gbs=2.0, ba_gbs=2.1, rtt_ms=0.02)
    assert to_recheck(hosts, [fast, better(dipped, again), broken]) == []
    throttled = PairMeasure("a", "c", ab_gbs=0.2, ba_gbs=0.2, rtt_ms=0.3)  # slow both times
    assert better(dipped, throttled).gbs == 0.5
    assert better(dipped, PairMeasure("a", "c", error="lost")) == dipped
