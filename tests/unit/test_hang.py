"""Hang detection: the detector's rules and reading real stack dumps.

The golden dumps under ``golden/hang/`` were captured from real processes:
``pyspy_*`` with ``py-spy dump --pid``, ``faulthandler_*`` from the
``SIGUSR1`` handler that corral's rank wrapper registers. ``ddp_*`` come from a
two-rank gloo job where rank 1 sleeps in ``step`` while rank 0 waits for it in
``all_reduce`` (or in DDP's backward); ``worker_*`` from a script run by
``python -m corral.agent.worker`` with a second, idle thread.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from corral.recovery.hang import (
    AUTO_HANG_TIMEOUT,
    Frame,
    HangDetector,
    HangVerdict,
    classify,
    collective_site,
    describe,
    parse_stack,
    parse_threads,
    top_frames,
)
from corral.recovery.hangwatch import HangWatch

GOLDEN = Path(__file__).parent / "golden" / "hang"
A0, A1, B2, B3 = ("tb1", 0), ("tb1", 1), ("tb2", 2), ("tb2", 3)


def golden(name: str) -> str:
    return (GOLDEN / name).read_text()


# -- detector ------------------------------------------------------------------------


def test_nothing_fires_while_ranks_progress() -> None:
    det = HangDetector(30, started=0)
    for t in range(0, 200, 10):
        for rank in (0, 1):
            det.observe("tb1", rank, t // 10, float(t))
        assert det.check(float(t) + 5, [A0, A1]) is None


def test_stalled_when_no_rank_progresses() -> None:
    det = HangDetector(30, started=0)
    det.observe("tb1", 0, 12, 100)
    det.observe("tb1", 1, 12, 101)
    assert det.check(130, [A0, A1]) is None  # 29 s since the newest progress
    verdict = det.check(131, [A0, A1])
    assert verdict is not None and verdict.kind == "stalled"
    assert verdict.seconds == 30
    assert verdict.suspects == [A0, A1]  # same step: the stacks will tell
    assert verdict.steps == {A0: 12, A1: 12}
    assert verdict.message() == "no rank made progress for 30 s (all at step 12)"


def test_repeating_a_step_is_not_progress() -> None:
    det = HangDetector(30, started=0)
    det.observe("tb1", 0, 5, 10)
    for t in range(11, 60):  # a heartbeat thread re-reporting the same step
        det.observe("tb1", 0, 5, float(t))
    verdict = det.check(41, [A0])
    assert verdict is not None and verdict.kind == "stalled" and verdict.seconds == 31


def test_a_step_counter_that_restarts_counts_as_progress() -> None:
    det = HangDetector(30, started=0)
    det.observe("tb1", 0, 99, 10)
    det.observe("tb1", 0, 0, 35)  # new epoch, counter back to 0
    assert det.check(60, [A0]) is None


def test_stalled_suspects_are_the_lowest_steps() -> None:
    det = HangDetector(30, started=0)
    det.observe("tb1", 0, 14, 100)
    det.observe("tb1", 1, 13, 95)
    det.observe("tb2", 2, 14, 100)
    verdict = det.check(140, [A0, A1, B2])
    assert verdict is not None and verdict.kind == "stalled"
    assert verdict.suspects == [A1]
    assert verdict.message() == (
        "no rank made progress for 40 s (steps 13-14; behind: rank 1 on tb1)"
    )


def test_lagging_rank_is_named() -> None:
    det = HangDetector(30, started=0)
    for rank in (0, 1, 2):
        det.observe("tb1" if rank < 2 else "tb2", rank, 12, 100)
    for t, step in ((110, 13), (125, 14)):
        det.observe("tb1", 0, step, t)
        det.observe("tb2", 2, step, t)
    assert det.check(130, [A0, A1, B2]) is None  # 25 s behind the others, not yet 30
    det.observe("tb1", 0, 15, 135)
    det.observe("tb2", 2, 15, 135)
    verdict = det.check(136, [A0, A1, B2])
    assert verdict is not None and verdict.kind == "lagging"
    assert verdict.suspects == [A1]
    assert verdict.seconds == 36
    assert verdict.message() == (
        "rank 1 on tb1 made no progress for 36 s (step 12; others at step 15)"
    )


def test_several_lagging_ranks() -> None:
    det = HangDetector(10, started=0)
    for key in (A0, A1, B2, B3):
        det.observe(*key, 1, 0)
    det.observe(*A0, 2, 20)
    det.observe(*B2, 3, 20)
    verdict = det.check(21, [A0, A1, B2, B3])
    assert verdict is not None and verdict.kind == "lagging"
    assert verdict.suspects == [A1, B3]
    assert verdict.message() == (
        "rank 1 on tb1 and rank 3 on tb2 made no progress for 21 s (at step 1; others at steps 2-3)"
    )


def test_never_reported_ranks_count_from_the_start() -> None:
    det = HangDetector(30, started=50)
    assert det.check(79, [A0, A1]) is None
    verdict = det.check(80, [A0, A1])
    assert verdict is not None and verdict.kind == "stalled"
    assert verdict.suspects == [A0, A1] and verdict.steps == {A0: None, A1: None}
    assert "no rank reported progress in 30 s since the start" in verdict.message()
    assert "sdk.report()" in verdict.message()


def test_a_rank_that_never_reports_does_not_lag() -> None:
    det = HangDetector(30, started=0)  # scripts often report from rank 0 only
    for t in range(0, 300, 5):
        det.observe("tb1", 0, t, float(t))
        assert det.check(float(t) + 1, [A0, A1]) is None


def test_stalled_with_some_ranks_never_reporting() -> None:
    det = HangDetector(30, started=0)
    det.observe(*A0, 7, 10)
    verdict = det.check(45, [A0, A1])
    assert verdict is not None and verdict.suspects == [A0]
    assert verdict.message() == ("no rank made progress for 35 s (the reporting ranks at step 7)")


def test_stalled_with_one_rank_silent_names_the_reporter_behind() -> None:
    # a restarted rank has not reported yet; of the two that did, one is behind: the
    # line names it (it did not: "the reporting ranks at steps 9-10", nobody named)
    det = HangDetector(8, started=0)
    A2 = ("tb3", 0)
    det.observe(*A0, 10, 5)
    det.observe(*A2, 9, 4)
    verdict = det.check(20, [A0, A1, A2])
    assert verdict is not None and verdict.suspects == [A2]
    assert verdict.message() == (
        "no rank made progress for 15 s (the reporting ranks at steps 9-10; behind: rank 0 on tb3)"
    )


def test_only_live_ranks_count() -> None:
    det = HangDetector(30, started=0)
    det.observe(*A0, 1, 0)
    det.observe(*A1, 1, 0)
    det.observe(*A0, 2, 40)
    assert det.check(41, [A0]) is None  # rank 1 exited: not lagging
    assert det.check(41, []) is None


def test_fires_once_until_a_new_attempt() -> None:
    det = HangDetector(30, started=0)
    first = det.check(30, [A0])
    assert first is not None and det.verdict is first
    assert det.check(60, [A0]) is None
    assert det.check(600, [A0, A1]) is None
    det.start(1000)
    assert det.verdict is None
    assert det.check(1029, [A0]) is None
    assert det.check(1030, [A0]) is not None


def test_start_forgets_progress() -> None:
    det = HangDetector(30, started=0)
    det.observe(*A0, 5, 10)
    det.start(100)
    verdict = det.check(130, [A0])
    assert verdict is not None and verdict.steps == {A0: None}


def test_forget_a_rank() -> None:
    det = HangDetector(10, started=0)
    det.observe(*A0, 1, 0)
    det.observe(*A1, 1, 0)
    det.observe(*A0, 2, 15)
    det.forget(*A1)
    assert det.check(16, [A0, A1]) is None  # A1 back to "never reported": not lagging


def test_for_option() -> None:
    explicit = HangDetector.for_option(45, started=3)
    assert explicit is not None and explicit.timeout == 45 and not explicit.armed
    assert explicit.check(1000.0, [("h", 0)]) is None  # start-up is never a hang
    explicit.observe("h", 0, 1, 1000.0)
    assert explicit.armed
    verdict = explicit.check(1046.0, [("h", 0)])
    assert verdict is not None and verdict.kind == "stalled"
    assert HangDetector.for_option(0) is None
    assert HangDetector.for_option(-1) is None
    auto = HangDetector.for_option(None, started=0)
    assert auto is not None and auto.timeout == AUTO_HANG_TIMEOUT and not auto.armed
    with pytest.raises(ValueError, match="hang timeout must be > 0, got 0"):
        HangDetector(0)


def test_auto_mode_waits_for_a_first_report() -> None:
    det = HangDetector.for_option(None, started=0)
    assert det is not None
    # A script that never reports is never flagged, however long it runs.
    assert det.check(10 * AUTO_HANG_TIMEOUT, [A0, A1]) is None
    det.observe(*A0, 1, 5000)
    assert det.armed
    assert det.check(5000 + AUTO_HANG_TIMEOUT - 1, [A0, A1]) is None
    verdict = det.check(5000 + AUTO_HANG_TIMEOUT, [A0, A1])
    assert verdict is not None and verdict.kind == "stalled" and verdict.suspects == [A0]


def test_auto_mode_never_reported_ranks_count_from_the_first_report() -> None:
    det = HangDetector(10, started=0, wait_for_first_report=True)
    det.observe(*A0, 1, 100)
    det.observe(*A0, 2, 105)
    # rank 1 has not reported: it cannot lag, and the start-up (0..100) is not held
    # against the job.
    assert det.check(114, [A0, A1]) is None
    verdict = det.check(115, [A0, A1])
    assert verdict is not None and verdict.kind == "stalled" and verdict.seconds == 10


def test_a_hold_by_corral_is_progress_then_the_clock_runs_again() -> None:
    # rank 0 waits in save_checkpoint for the coordinator's copy from 100 to 160;
    # rank 1 waits for rank 0 in the next all-reduce meanwhile
    det = HangDetector(30, started=0, wait_for_first_report=True)
    det.hold(50)  # before any report: nothing to hold, and it does not arm the detector
    assert not det.armed
    det.observe(*A0, 10, 100)
    det.observe(*A1, 10, 100)
    for t in range(100, 161, 5):
        det.hold(float(t))
        assert det.check(float(t), [A0, A1]) is None
    assert det.check(189, [A0, A1]) is None  # 29 s after the copy ended
    verdict = det.check(190, [A0, A1])
    assert verdict is not None and verdict.kind == "stalled" and verdict.seconds == 30


# -- stacks --------------------------------------------------------------------------


def test_parse_py_spy_dump() -> None:
    threads = parse_threads(golden("pyspy_worker_sleep.txt"))
    assert [t.name for t in threads] == ["MainThread", "Thread-1 (worker)"]
    frames = parse_stack(golden("pyspy_worker_sleep.txt"))
    assert frames[0] == Frame("step", "train2.py", 11)
    assert frames[1] == Frame("main", "train2.py", 17)
    assert frames[-1] == Frame("_run_module_as_main", "<frozen runpy>", 198)
    assert top_frames(golden("pyspy_worker_sleep.txt")) == [
        "step (train2.py:11)",
        "main (train2.py:17)",
        "<module> (train2.py:21)",
    ]


def test_parse_faulthandler_dump() -> None:
    text = golden("faulthandler_worker_sleep.txt")
    threads = parse_threads(text)
    assert len(threads) == 2 and threads[1].current
    assert threads[0].frames[0] == Frame("worker", "train2.py", 7)
    assert top_frames(text, 2) == ["step (train2.py:11)", "main (train2.py:17)"]
    frames = parse_stack(text)
    assert frames[6].file == "/work/main/src/corral/agent/worker.py"
    assert str(frames[6]) == "main (worker.py:135)"


def test_faulthandler_main_thread_without_current_marker() -> None:
    # The signal went to one of gloo's C++ threads: no "Current thread" line.
    text = golden("faulthandler_ddp_backward.txt")
    assert "Current thread" not in text
    assert top_frames(text, 1) == ["_engine_run_backward (torch/autograd/graph.py:979)"]


def test_library_paths_are_shortened_like_py_spy() -> None:
    spy = parse_stack(golden("pyspy_ddp_rank0_allreduce.txt"))
    fault = parse_stack(golden("faulthandler_ddp_rank0_allreduce.txt"))
    assert [str(f) for f in spy][:1] == [str(f) for f in fault][:1]
    assert str(fault[0]) == "all_reduce (torch/distributed/distributed_c10d.py:3252)"
    assert Frame("run", "/usr/lib/python3.11/threading.py", 982).short_file() == "threading.py"


def test_the_last_of_several_dumps_wins() -> None:
    once = golden("faulthandler_worker_sleep.txt")
    twice = once + once.replace("line 11 in step", "line 12 in step")
    assert parse_stack(twice)[0] == Frame("step", "train2.py", 12)
    assert len(parse_threads(twice)) == 2
    spy = golden("pyspy_worker_sleep.txt")
    assert len(parse_threads(spy + spy)) == 2


def test_unparseable_text_has_no_frames() -> None:
    assert parse_stack("") == []
    assert parse_stack("Error: Operation not permitted (os error 1)\n") == []
    assert top_frames("garbage\n  more garbage\n") == []


@pytest.mark.parametrize("fmt", ["pyspy", "faulthandler"])
def test_classify_ddp_hang(fmt: str) -> None:
    stacks = {
        A0: golden(f"{fmt}_ddp_rank0_allreduce.txt"),
        A1: golden(f"{fmt}_ddp_rank1_sleep.txt"),
        B2: golden(f"{fmt}_ddp_backward.txt"),
        B3: "",
    }
    stuck, waiting = classify(stacks)
    assert stuck == [A1]
    assert waiting == [A0, B2]


def test_collective_site_names_the_caller() -> None:
    frames = parse_stack(golden("pyspy_ddp_rank0_allreduce.txt"))
    assert collective_site(frames) == (
        "all_reduce (torch/distributed/distributed_c10d.py:3252) from step (ddp.py:15)"
    )
    frames = parse_stack(golden("faulthandler_ddp_backward.txt"))
    assert collective_site(frames) == (
        "_engine_run_backward (torch/autograd/graph.py:979) from step (ddpbw.py:14)"
    )


def test_classify_waits_under_stdlib_locks() -> None:
    text = (
        'Thread 1 (idle): "MainThread"\n'
        "    Condition.wait (threading.py:327)\n"
        "    Work.wait (torch/distributed/distributed_c10d.py:100)\n"
        "    main (train.py:3)\n"
    )
    user_lock = (
        'Thread 1 (idle): "MainThread"\n'
        "    Condition.wait (threading.py:327)\n"
        "    load (train.py:9)\n"
    )
    assert classify({A0: text, A1: user_lock}) == ([A1], [A0])


def test_a_rank_waiting_for_torchfts_quorum_waits_and_the_hung_group_is_blamed() -> None:
    # in place, a hung group (its Manager still heartbeating) stalls its peers in
    # their quorum until the hang watch fires: every rank "made no progress", and the
    # one to tear down is the one outside torchft, not the first peer that waits
    quorum = (
        'Thread 1 (idle): "MainThread"\n'
        "    Condition.wait (threading.py:327)\n"
        "    Future.result (concurrent/futures/_base.py:451)\n"
        "    Manager.wait_quorum (torchft/manager.py:632)\n"
        "    <module> (ft_steps.py:120)\n"
    )
    hung = 'Thread 1 (idle): "MainThread"\n    hang_forever (ft_steps.py:65)\n'
    stacks = {A0: quorum, A1: hung, B2: quorum}
    assert classify(stacks) == ([A1], [A0, B2])
    verdict = HangVerdict("stalled", [A0, A1, B2], 7.0, {A0: 6, A1: 6, B2: 6})
    assert HangWatch.culprit(verdict, stacks) == A1


def test_describe_a_ddp_hang() -> None:
    verdict = HangVerdict("stalled", [A0, A1], 31.4, {A0: 12, A1: 12, B2: None})
    stacks = {
        A0: golden("pyspy_ddp_rank0_allreduce.txt"),
        A1: golden("faulthandler_ddp_rank1_sleep.txt"),
    }
    paths = {key: f"runs/j1/hang/{key[0]}.{key[1]}.txt" for key in stacks}
    assert describe(verdict, stacks, paths) == [
        "hang: no rank made progress for 31 s (the reporting ranks at step 12)",
        "rank 1 on tb1 is stuck in step (ddp.py:13) <- main (ddp.py:22) <- <module> (ddp.py:27)",
        "rank 0 on tb1 waits in a collective at"
        " all_reduce (torch/distributed/distributed_c10d.py:3252) from step (ddp.py:15)",
        "no stack from rank 2 on tb2",
        "stack dumps: runs/j1/hang/ (2 files)",
        "  rank 1 on tb1: runs/j1/hang/tb1.1.txt",
    ]


def test_describe_groups_many_ranks() -> None:
    waiting = golden("pyspy_ddp_rank0_allreduce.txt")
    stacks = {("h", r): waiting for r in range(12)}
    stacks[("h", 12)] = golden("pyspy_ddp_rank1_sleep.txt")
    verdict = HangVerdict("lagging", [("h", 12)], 40, {key: 3 for key in stacks})
    lines = describe(verdict, stacks, frames=1)
    assert lines[1] == "rank 12 on h is stuck in step (ddp.py:13)"
    assert lines[2].startswith("rank 0 on h, rank 1 on h, ")
    assert " and 4 more wait in a collective at all_reduce " in lines[2]
    assert len(lines) == 3


def test_describe_without_stacks() -> None:
    verdict = HangVerdict("lagging", [A1], 36, {A0: 15, A1: 12})
    assert describe(verdict, {}) == [
        "hang: rank 1 on tb1 made no progress for 36 s (step 12; others at step 15)",
        "no stack from rank 1 on tb1 and rank 0 on tb1",
    ]


def test_describe_when_every_rank_waits() -> None:
    text = golden("pyspy_ddp_rank0_allreduce.txt")
    verdict = HangVerdict("stalled", [A0, A1], 30, {A0: 1, A1: 1})
    lines = describe(verdict, {A0: text, A1: text})
    assert lines[1].startswith("rank 0 on tb1 and rank 1 on tb1 wait in a collective")
    assert lines[2] == "every rank with a stack waits in a collective (mismatched collectives?)"
