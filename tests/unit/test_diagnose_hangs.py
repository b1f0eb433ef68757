"""Hang forensics over stack fixtures and a synthetic NCCL flight recorder dump."""

from __future__ import annotations

import pickle
from pathlib import Path
from typing import Any

import pytest

from corral.diagnose.hangs import (
    analyse_flight_recorder,
    group_stacks,
    hang_report,
    odd_ones_out,
    render_markdown,
)
from tests.conftest import require_torch

GOLDEN = Path(__file__).parent / "golden" / "hang"


def _in_all_reduce(line: int = 21) -> str:
    return (
        "Process 100: python train.py\n"
        'Thread 100 (idle): "MainThread"\n'
        "    all_reduce (torch/distributed/distributed_c10d.py:3252)\n"
        "    wrapper (torch/distributed/c10d_logger.py:83)\n"
        f"    main (train.py:{line})\n"
        "    <module> (train.py:40)\n"
    )


IN_BARRIER = (
    "Process 102: python train.py\n"
    'Thread 102 (idle): "MainThread"\n'
    "    barrier (torch/distributed/distributed_c10d.py:4811)\n"
    "    wrapper (torch/distributed/c10d_logger.py:83)\n"
    "    main (train.py:27)\n"
    "    <module> (train.py:40)\n"
)


def test_the_rank_in_another_collective_is_the_odd_one_out() -> None:
    stacks = {("h0", 0): _in_all_reduce(), ("h1", 1): _in_all_reduce(), ("h2", 2): IN_BARRIER}
    groups = group_stacks(stacks)
    assert [g.ranks for g in groups] == [[("h0", 0), ("h1", 1)], [("h2", 2)]]
    majority, odd = odd_ones_out(groups)
    assert majority is groups[0] and odd == [groups[1]]
    assert odd[0].where.startswith("barrier (torch/distributed/distributed_c10d.py:4811)")
    assert odd[0].where.endswith("from main (train.py:27)")
    report = hang_report("no rank made progress for 3 s", stacks)
    assert report["summary"] == (
        "odd one out: rank 2 on h2 at barrier (torch/distributed/distributed_c10d.py:4811)"
        " from main (train.py:27); the others are at all_reduce"
        " (torch/distributed/distributed_c10d.py:3252) from main (train.py:21)"
    )
    assert [(o["host"], o["rank"]) for o in report["odd"]] == [("h2", 2)]
    text = render_markdown(report)
    assert text.startswith("# Hang report\n")
    assert "- odd one out: rank 2 on h2 at `barrier" in text
    assert "### rank 0 on h0, rank 1 on h1 (waiting in a collective)" in text


def test_a_line_apart_is_another_place_and_a_tie_names_nobody() -> None:
    two = {("h0", 0): _in_all_reduce(21), ("h1", 1): _in_all_reduce(25)}
    assert len(group_stacks(two)) == 2
    assert odd_ones_out(group_stacks(two)) == (None, [])
    assert hang_report("m", two)["summary"] == "the ranks' stacks differ with no majority"
    same = {("h0", 0): _in_all_reduce(), ("h1", 1): _in_all_reduce()}
    report = hang_report("m", same)
    assert report["summary"].startswith("every rank is at all_reduce")
    assert report["odd"] == []


def test_a_tie_between_waiting_and_stuck_names_the_stuck_rank() -> None:
    stacks = {
        ("a", 0): (GOLDEN / "pyspy_ddp_rank0_allreduce.txt").read_text(),
        ("b", 1): (GOLDEN / "pyspy_ddp_rank1_sleep.txt").read_text(),
        ("c", 2): "(no stack: process 9 is not running)\n",
    }
    report = hang_report("m", stacks)
    assert [(o["host"], o["rank"]) for o in report["odd"]] == [("b", 1)]
    assert report["no_stack"] == [{"host": "c", "rank": 2}]
    assert "No stack from rank 2 on c." in render_markdown(report)


def _entry(record: int, seq: int, state: str) -> dict[str, Any]:
    """One flight recorder entry as ProcessGroupNCCL writes it (torch 2.x format)."""
    return {
        "record_id": record,
        "pg_id": 0,
        "process_group": ("0", "default_pg"),
        "collective_seq_id": seq,
        "p2p_seq_id": 0,
        "op_id": seq,
        "profiling_name": "nccl:all_reduce",
        "time_created_ns": 1000 + record,
        "input_sizes": [[4]],
        "output_sizes": [[4]],
        "input_dtypes": ["Float"],
        "output_dtypes": ["Float"],
        "state": state,
        "time_discovered_started_ns": None,
        "time_discovered_completed_ns": None,
        "retired": state == "completed",
        "timeout_ms": 600000,
        "is_p2p": False,
        "frames": [{"name": "train_step", "filename": "train.py", "line": 42}],
    }


def _write_dumps(directory: Path, entries_per_rank: dict[int, int]) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    for rank, count in entries_per_rank.items():
        dump = {
            "version": "2.10",
            "pg_config": {"0": {"name": "0", "desc": "default_pg", "ranks": "[0, 1, 2]"}},
            "pg_status": {},
            "entries": [
                _entry(i, i + 1, "completed" if i < 4 else "scheduled") for i in range(count)
            ],
        }
        (directory / f"rank_{rank}").write_bytes(pickle.dumps(dump))


def test_flight_recorder_names_the_collective_and_the_missing_rank(tmp_path: Path) -> None:
    require_torch()
    _write_dumps(tmp_path / "fr", {0: 5, 1: 5, 2: 4})  # rank 2 never entered all_reduce #5
    finding = analyse_flight_recorder(tmp_path / "fr")
    assert finding is not None
    assert (finding.collective, finding.sequence, finding.missing_ranks) == (
        "nccl:all_reduce",
        5,
        [2],
    )
    assert finding.expected_ranks == [0, 1, 2]
    assert finding.message() == (
        "nccl:all_reduce #5 (group 0:default_pg, scheduled): rank 2 never entered it"
    )
    report = hang_report("m", {("h0", 0): _in_all_reduce()}, flight=finding)
    assert report["summary"].startswith("flight recorder: nccl:all_reduce #5")
    assert "never entered by ranks: 2" in render_markdown(report)


def test_flight_recorder_all_matched_and_unreadable(tmp_path: Path) -> None:
    require_torch()
    _write_dumps(tmp_path / "ok", {0: 4, 1: 4, 2: 4})
    assert analyse_flight_recorder(tmp_path / "ok") is None
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / "rank_0").write_bytes(b"not a pickle")
    with pytest.raises(ValueError, match="cannot analyse the flight recorder dumps"):
        analyse_flight_recorder(tmp_path / "bad")
