"""The shared formatters behind every view of a job: the reason (a failure names its
root cause, a stop names who asked), the pre-flight's findings, the display name,
the master and node numbers as torchrun made them."""

from __future__ import annotations

import asyncio
import io
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from rich.console import Console

from corral.cli.jobview import print_status
from corral.job.events import JobEvent, Message
from corral.job.result import JobResult
from corral.job.summary import finding_line, preflight_findings, reason_text
from corral.service.jobs import JobManager
from corral.service.launch import request_stop, stopped_by
from corral.service.models import DispatchIn
from corral.store import Store, open_store
from corral.transport.fake import FakeTransport
from tests.unit.test_service_jobs import (
    Spawned,
    add_machines,
    job_request,
    machine,
    manager,
    write_events,
)
from tests.unit.test_supervisor import HOSTS, _stop_on_request_started, _supervisor, _until


@pytest.fixture
def store(tmp_path: Path) -> Iterator[Store]:
    with open_store(f"sqlite:///{tmp_path / 'corral.db'}") as opened:
        yield opened


@pytest.fixture
def planned(store: Store, tmp_path: Path) -> tuple[JobManager, Spawned, str]:
    add_machines(store, machine("a", local=True), machine("b", local=True))
    jobs, spawned = manager(store, tmp_path)
    return jobs, spawned, jobs.plan(job_request(tmp_path)).job_id


def test_a_reason_reads_the_same_in_every_view() -> None:
    assert reason_text("failure", "rank 1 on n2 exited with code 1") == (
        "rank 1 on n2 exited with code 1"
    )
    assert reason_text("failure") == "a rank failed"
    assert reason_text("stopped by the API") == "stopped by the API"


def test_a_stop_names_who_asked_and_no_terminal_key(tmp_path: Path) -> None:
    said: list[JobEvent] = []
    sup = _supervisor(FakeTransport({h: _stop_on_request_started for h in HOSTS}), tmp_path)
    sup.emit = said.append

    async def go() -> JobResult:
        task = asyncio.ensure_future(sup.run())
        await _until(lambda: all(n.proc is not None for n in sup.nodes))
        sup.interrupt("the API")
        return await asyncio.wait_for(task, 20)

    result = asyncio.run(go())
    assert (result.state.value, result.reason) == ("cancelled", "stopped by the API")
    texts = [e.text for e in said if isinstance(e, Message)]
    assert "stopped by the API: stopping every node" in texts, texts
    assert not any("Ctrl-C" in t for t in texts)


def test_the_server_tells_the_supervisor_who_stops_the_job(tmp_path: Path) -> None:
    assert stopped_by(tmp_path) is None  # a signal nobody explained: Ctrl-C or SIGTERM
    request_stop(tmp_path, "the API")
    assert stopped_by(tmp_path) == "the API"


def test_the_preflight_findings_are_the_warnings_and_failures() -> None:
    report = {
        "checks": [
            {"name": "ssh", "status": "pass"},
            {"name": "disk", "status": "warn", "warning": "3 GiB free", "fix_command": "df"},
            {"name": "port", "status": "fail", "error": "29500 in use"},
        ]
    }
    found = preflight_findings(report)
    assert [finding_line(f) for f in found] == [
        "pre-flight disk: 3 GiB free (fix: df)",
        "pre-flight port: 29500 in use",
    ]
    out = io.StringIO()
    status = {
        "job_id": "j",
        "status": "running",
        "reason": "",
        "world_size": 2,
        "preflight": found[:1],
    }
    print_status(status, Console(file=out, width=200))
    assert "  pre-flight disk: 3 GiB free (fix: df)" in out.getvalue().splitlines()


def test_the_status_names_the_master_where_rank_0_ran_and_no_eta_once_ended(
    planned: tuple[JobManager, Spawned, str],
) -> None:
    jobs, _, job_id = planned
    jobs.dispatch(DispatchIn(job_id=job_id))
    events = Path(jobs.row(job_id).run_dir) / "events.jsonl"
    now = time.time()
    write_events(
        events,
        {"kind": "attempt_started", "time": now, "number": 0, "hosts": ["a", "b"], "world_size": 2},
        {"kind": "progress", "time": now, "host": "b", "rank": 0, "step": 1, "total": 8},
        {"kind": "progress", "time": now, "host": "a", "rank": 1, "step": 1, "total": 8},
        {"kind": "progress", "time": now + 1, "host": "b", "rank": 0, "step": 2, "total": 8},
        {"kind": "progress", "time": now + 1, "host": "a", "rank": 1, "step": 2, "total": 8},
    )  # fmt: skip
    jobs.ingest_once()
    running = jobs.status(job_id)
    assert running.master == "b"  # torchrun's rendezvous put rank 0 on b
    assert [(n.host, n.node_rank) for n in running.nodes] == [("b", 0), ("a", 1)]
    assert running.nodes[0].progress["eta_s"] is not None
    assert running.name == "train.py"  # the script's name when the job has none
    write_events(
        events,
        {"kind": "state", "time": now, "old": "running", "state": "stopping",
         "attempt": 0, "reason": "failure"},
        {"kind": "finished", "time": now + 2, "state": "failed", "exit_code": 1,
         "result": {"ended": now + 2, "reason": "failure", "failures": [
             {"host": "a", "rank": 1, "code": 1, "time": now,
              "message": "rank 1 on a exited with code 1"}]}},
    )  # fmt: skip
    jobs.ingest_once()
    ended = jobs.status(job_id)
    assert ended.reason == "rank 1 on a exited with code 1"
    assert all(n.progress["eta_s"] is None for n in ended.nodes)
