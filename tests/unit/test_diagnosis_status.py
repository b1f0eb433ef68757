"""Stragglers and hang reports from the supervisor to the server's status: the
supervisor emits one typed hang-report event where it writes the report, ingest keeps
both kinds of events, the status carries them (the latest straggler per rank and
section, the last hang report) and ``corral job status`` prints them."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from rich.console import Console

from corral.cli.jobview import diagnosis_lines, print_status
from corral.job.events import (
    AttemptStarted,
    HangReported,
    JobEvent,
    OddRank,
    StragglerFound,
    StuckCollective,
    decode_event,
    json_of,
)
from corral.job.logfiles import LogFiles
from corral.job.supervisor import AttemptSupervisor
from corral.service.eventlog import EVENTS_FILE, append_event
from corral.service.ingest import Ingest, Live
from corral.service.queries import Queries
from corral.store import Store, open_store
from corral.store.models import Event, Job
from corral.transport.fake import FakeNode, FakeTransport
from tests.unit.test_supervisor import _commands, _ranks, _stop_on_request

JOB = "j-diag"


@pytest.fixture
def store(tmp_path: Path) -> Iterator[Store]:
    with open_store(f"sqlite:///{tmp_path / 'corral.db'}") as opened:
        yield opened


def _running(store: Store, run_dir: Path) -> Path:
    """A running job of the server (no supervisor process: never marked lost); its
    events file."""
    run_dir.mkdir(parents=True, exist_ok=True)
    with store.session() as s:
        s.add(Job(id=JOB, state="running", run_dir=str(run_dir), created=time.time()))
    return run_dir / EVENTS_FILE


def _write(path: Path, *events: JobEvent) -> None:
    for event in events:
        append_event(path, json_of(event))


def _straggler(rank: int, ratio: float, step: int, section: str = "compute") -> StragglerFound:
    text = f"straggler: rank {rank} on b, {section} {ratio:.1f}x the median for 5 steps"
    return StragglerFound(
        job_id=JOB,
        host="b",
        rank=rank,
        section=section,
        ratio=ratio,
        basis="median",
        span=5,
        step=step,
        text=text,
    )


HANG = HangReported(
    job_id=JOB,
    summary="odd one out: rank 3 on b at hang_forever (train.py:12); the others are at "
    "all_reduce (train.py:28)",
    message="no rank made progress for 1 s",
    odd=[OddRank(host="b", rank=3, where="hang_forever (train.py:12)", frames=["main"])],
    collective=StuckCollective(
        collective="nccl:all_reduce", sequence=5, group="0:default_pg", missing_ranks=[3]
    ),
    report="/runs/j-diag/hang/report.md",
)


def test_ingest_keeps_them_and_the_status_carries_them(store: Store, tmp_path: Path) -> None:
    path = _running(store, tmp_path / "runs" / JOB)
    _write(
        path,
        AttemptStarted(job_id=JOB, number=1, hosts=["a", "b"], world_size=4),
        _straggler(3, 2.5, 20),
        _straggler(2, 1.8, 22, "data"),
        _straggler(3, 5.1, 40),  # named again, later: the latest wins, its place stays
        HANG,
    )
    live = Live()
    ingest = Ingest(store, live)
    ingest.ingest(JOB)
    with store.session() as s:
        kinds = [e.kind for e in s.query(Event).filter(Event.job_id == JOB).order_by(Event.pos)]
    assert kinds == ["attempt_started", "straggler", "straggler", "straggler", "hang_report"]
    status = Queries(store, ingest, live, {}).status(JOB)
    assert [(x.host, x.rank, x.section, x.ratio, x.step) for x in status.stragglers] == [
        ("b", 3, "compute", 5.1, 40),
        ("b", 2, "data", 1.8, 22),
    ]
    assert status.stragglers[0].text.startswith("straggler: rank 3 on b, compute 5.1x")
    hang = status.hang
    assert hang is not None and hang.summary == HANG.summary
    assert [(o.host, o.rank, o.where) for o in hang.odd] == [("b", 3, "hang_forever (train.py:12)")]
    assert hang.collective is not None and hang.collective.missing_ranks == [3]
    assert hang.report == "/runs/j-diag/hang/report.md"
    # corral job status prints what the API returns
    console = Console(width=200, record=True, color_system=None)
    print_status(status.model_dump(mode="json"), console)
    text = console.export_text()
    assert "straggler: rank 3 on b, compute 5.1x the median for 5 steps" in text
    assert f"hang report: {HANG.summary}" in text
    assert "odd one out: rank 3 on b at hang_forever (train.py:12)" in text
    assert "collective: nccl:all_reduce #5 (group 0:default_pg); never entered by ranks 3" in text
    assert "report: /runs/j-diag/hang/report.md" in text


def test_a_job_without_them_has_none(store: Store, tmp_path: Path) -> None:
    path = _running(store, tmp_path / "runs" / JOB)
    _write(path, AttemptStarted(job_id=JOB, number=1, hosts=["a"], world_size=1))
    live = Live()
    ingest = Ingest(store, live)
    status = Queries(store, ingest, live, {}).status(JOB)
    assert status.stragglers == [] and status.hang is None
    console = Console(width=200, record=True, color_system=None)
    print_status(status.model_dump(mode="json"), console)
    assert "straggler" not in console.export_text() and "hang" not in console.export_text()


def test_the_hang_event_round_trips_as_a_line_of_the_events_file() -> None:
    data = json_of(HANG)
    assert decode_event(data, JOB) == HANG


def test_the_supervisor_emits_one_hang_report_event_where_it_writes_the_report(
    tmp_path: Path,
) -> None:
    sleeping = 'Thread 1 (idle): "MainThread"\n    hang_forever (train.py:12)\n'
    waiting = (
        'Thread 1 (active): "MainThread"\n'
        "    all_reduce (torch/distributed/distributed_c10d.py:2500)\n"
        "    main (train.py:28)\n"
    )

    async def hanging(node: FakeNode) -> int:
        node.event("started", pid=1, pgids=[1])
        for rank in _ranks(node):
            node.event("rank_start", rank=rank, local_rank=rank % 2, pid=100 + rank)
            node.event("report", type="progress", rank=rank, step=5, total=10)
        await node.next_op("dump")
        stacks = [
            {"rank": r, "pid": 100 + r, "method": "py-spy", "error": None,
             "text": sleeping if r == 3 else waiting}
            for r in _ranks(node)
        ]  # fmt: skip
        node.event("stacks", stacks=stacks)
        return await _stop_on_request(node)

    events: list[JobEvent] = []
    sup = AttemptSupervisor(
        _commands(),
        FakeTransport({h: hanging for h in ("a", "b", "c")}),
        events.append,
        logs=LogFiles(tmp_path / "logs"),
        job_id="j",
        agent_argv=lambda h: ["python3", "-m", "corral.agent"],
        heartbeat_interval=0.05,
        hang_timeout=1.0,
        hang_dir=tmp_path / "hang",
    )
    asyncio.run(asyncio.wait_for(sup.run(handle_signals=False), 20))
    reported = [e for e in events if isinstance(e, HangReported)]
    assert len(reported) == 1
    hang = reported[0]
    assert [(o.host, o.rank) for o in hang.odd] == [("b", 3)], hang
    assert hang.odd[0].where.startswith("hang_forever (train.py:12)")
    assert hang.summary.startswith("odd one out: rank 3 on b")
    assert hang.report == str(tmp_path / "hang" / "report.md")
    assert (tmp_path / "hang" / "report.json").is_file()
    assert hang.collective is None  # a CPU job: no flight recorder


def test_a_rank_in_another_collective_is_shown_with_it() -> None:
    hang = {
        "summary": "flight recorder: gloo:all_reduce #12 ...",
        "collective": json_of(
            HangReported.of(
                JOB,
                {
                    "summary": "s",
                    "flight_recorder": {
                        "collective": "gloo:all_reduce",
                        "sequence": 12,
                        "group": "0:default_pg",
                        "missing_ranks": [],
                        "mismatched": [{"rank": 2, "collective": "gloo:barrier"}],
                    },
                },
                None,
            )
        )["collective"],
    }
    lines = [line for line, _ in diagnosis_lines({"hang": hang})]
    assert (
        "  collective: gloo:all_reduce #12 (group 0:default_pg); rank 2 was in gloo:barrier"
        " instead" in lines
    )


def test_a_hang_root_cause_is_labelled_as_the_stack_it_quotes() -> None:
    """corral job status reads the root cause the ingest stored: its tail is a stack."""
    from corral.cli.jobview import root_cause_block

    cause = {
        "host": "local-0",
        "rank": None,
        "message": "hang: no rank made progress for 3 s; all 4 ranks at f (train.py:3)",
        "stderr_tail": ["f (train.py:3)", "main (train.py:9)"],
        "tail": "the stack every rank shares, innermost frame first",
    }
    text = root_cause_block(cause).plain
    assert "  the stack every rank shares, innermost frame first:\n    f (train.py:3)" in text
    assert "stderr" not in text
