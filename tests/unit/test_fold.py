"""The launchers' teardown noise is folded the same way in every log view: the live
terminal (tests/unit/test_output.py), ``corral logs`` from the log files, the API's
output pages (``corral job logs``) and the event stream the web page reads."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import update

from corral.cli.logs import _print
from corral.fleet.logs import attempt_offsets, teardown_offsets
from corral.job.events import AttemptStarted, LogLines, RankExited, StateChanged
from corral.job.fold import TeardownFold, fold_note, teardown_marker
from corral.job.logfiles import NODE_RANK_LABEL, LogFiles
from corral.job.states import JobState
from corral.service.eventlog import EVENTS_FILE
from corral.service.jobs import JobManager
from corral.service.models import DispatchIn
from corral.store import Store, open_store
from corral.store.models import Job
from tests.unit.test_service_jobs import (
    Spawned,
    add_machines,
    job_request,
    machine,
    manager,
    write_events,
)

NODE = NODE_RANK_LABEL


@pytest.fixture
def store(tmp_path: Path) -> Iterator[Store]:
    with open_store(f"sqlite:///{tmp_path / 'corral.db'}") as opened:
        yield opened


@pytest.fixture
def planned(store: Store, tmp_path: Path) -> tuple[JobManager, Spawned, str]:
    add_machines(store, machine("a", local=True), machine("b", local=True))
    jobs, spawned = manager(store, tmp_path)
    return jobs, spawned, jobs.plan(job_request(tmp_path)).job_id


NOISE = (
    "Traceback (most recent call last):\n"
    '  File "torchrun", line 8, in <module>\n'
    "torch.distributed.elastic.multiprocessing.api.SignalException: "
    "Process 7 got signal: 15\n"
)


def _state(old: JobState, new: JobState) -> StateChanged:
    return StateChanged(job_id="j", old=old, state=new)


def test_node_output_after_the_stop_is_folded_and_noted_once() -> None:
    begun: list[str] = []
    fold = TeardownFold(on_begin=begun.append)
    fold.see(AttemptStarted(job_id="j", number=0, hosts=["n1", "n2"], world_size=2))
    assert not fold.see(LogLines(job_id="j", host="n1", rank=NODE, data=b"rendezvous ok\n"))
    fold.see(_state(JobState.RUNNING, JobState.STOPPING))
    assert begun == ["n1", "n2"]
    assert fold.see(LogLines(job_id="j", host="n1", rank=NODE, data=NOISE.encode()))
    assert not fold.see(LogLines(job_id="j", host="n1", rank=1, data=b"a rank's own error\n"))
    fold.see(_state(JobState.STOPPING, JobState.FAILED))
    assert fold.ended
    assert fold.flush() == [fold_note("n1", 3)]
    assert fold.flush() == []
    assert fold_note("n1", 1) == "n1: the launcher's teardown output (1 line) is in n1.node.log"


def test_corral_logs_folds_what_followed_the_recorded_teardown(
    tmp_path: Path, capsysbinary: pytest.CaptureFixture[bytes]
) -> None:
    log_dir = tmp_path / "logs"
    logs = LogFiles(log_dir, attempt=0)
    marker = teardown_marker(logs)
    marker.on_event(AttemptStarted(job_id="j", number=0, hosts=["n1"], world_size=1))
    logs.write("n1", NODE, b"rendezvous ok\n")
    logs.write("n1", 0, b"step 1\n")
    marker.on_event(RankExited(job_id="j", host="n1", rank=0, code=1, last=True))
    logs.write("n1", NODE, NOISE.encode())
    logs.close()
    assert teardown_offsets(log_dir) == {"n1.node.log": [len(b"rendezvous ok\n")]}
    assert (log_dir / "n1.node.log").read_text().endswith(NOISE)  # the file keeps it all
    files = [
        type("F", (), {"host": "n1", "rank": None, "path": log_dir / "n1.node.log"})(),
        type("F", (), {"host": "n1", "rank": 0, "path": log_dir / "n1.0.log"})(),
    ]
    _print(files, attempt_offsets(log_dir), {}, teardown_offsets(log_dir))  # type: ignore[arg-type]
    assert capsysbinary.readouterr().out.decode().splitlines() == [
        "[n1] rendezvous ok",
        f"[n1] [corral] {fold_note('n1', 3)}",
        "[n1:0] step 1",
    ]


def _stopped_job(jobs: JobManager, job_id: str) -> Path:
    jobs.dispatch(DispatchIn(job_id=job_id))
    events = Path(jobs.row(job_id).run_dir) / EVENTS_FILE
    now = time.time()
    write_events(
        events,
        {"kind": "attempt_started", "time": now, "number": 0, "hosts": ["a", "b"], "world_size": 2},
        {"kind": "log", "time": now, "host": "a", "rank": -1, "text": "rendezvous ok\n"},
        {"kind": "log", "time": now, "host": "b", "rank": 1, "text": "ValueError: bad\n"},
        {"kind": "state", "time": now, "old": "running", "state": "stopping", "attempt": 0},
        {"kind": "log", "time": now, "host": "a", "rank": -1, "text": NOISE},
        {"kind": "log", "time": now, "host": "b", "rank": -1, "text": NOISE},
        {"kind": "state", "time": now, "old": "stopping", "state": "failed", "attempt": 0},
        {"kind": "finished", "time": now, "state": "failed", "exit_code": 1,
         "result": {"ended": now, "failures": []}},
    )  # fmt: skip
    return events


def test_the_output_pages_fold_the_teardown_and_go_on_where_the_last_page_was(
    planned: tuple[JobManager, Spawned, str],
) -> None:
    jobs, _, job_id = planned
    _stopped_job(jobs, job_id)
    page = jobs.output(job_id)
    assert page.lines == [
        "[a] rendezvous ok",
        "[b:1] ValueError: bad",
        f"[corral] {fold_note('a', 3)}",
        f"[corral] {fold_note('b', 3)}",
    ]
    first = jobs.output(job_id, limit=2)  # a page that ends before the stop
    rest = jobs.output(job_id, offset=first.next_offset)
    assert first.lines + rest.lines == page.lines


def test_the_event_stream_folds_the_teardown_into_one_message_per_node(
    planned: tuple[JobManager, Spawned, str],
) -> None:
    jobs, _, job_id = planned
    _stopped_job(jobs, job_id)

    async def read(start: int = 0) -> list[dict[str, object]]:
        return [ev.data async for ev in jobs.queries.events(job_id, start)]

    seen = asyncio.run(read())
    logs = [(d["host"], d["text"]) for d in seen if d["kind"] == "log"]
    assert logs == [("a", "rendezvous ok\n"), ("b", "ValueError: bad\n")]
    notes = [d["text"] for d in seen if d["kind"] == "message"]
    assert notes == [fold_note("a", 3), fold_note("b", 3)]
    assert [d["kind"] for d in seen][-2:] == ["state", "finished"]


def test_the_event_stream_of_a_queued_job_sees_it_start(
    planned: tuple[JobManager, Spawned, str], store: Store
) -> None:
    """A queued job has no run dir yet: the stream reads its events file once it has
    one, not ``events.jsonl`` in the server's working directory."""
    jobs, _, job_id = planned
    run_dir = jobs.row(job_id).run_dir
    with store.session() as s:
        s.execute(update(Job).where(Job.id == job_id).values(state="queued", run_dir=""))

    async def go() -> list[str]:
        kinds: list[str] = []

        async def read() -> None:
            async for ev in jobs.queries.events(job_id):
                kinds.append(str(ev.data["kind"]))

        task = asyncio.ensure_future(read())
        await asyncio.sleep(0.3)  # the stream waits on the queued job
        with store.session() as s:
            s.execute(update(Job).where(Job.id == job_id).values(state="running", run_dir=run_dir))
        now = time.time()
        write_events(
            Path(run_dir) / EVENTS_FILE,
            {"kind": "state", "time": now, "old": "pending", "state": "running", "attempt": 0},
            {"kind": "finished", "time": now, "state": "succeeded", "exit_code": 0,
             "result": {"ended": now, "failures": []}},
        )  # fmt: skip
        await asyncio.wait_for(task, 10)
        return kinds

    assert asyncio.run(go()) == ["state", "finished"]
