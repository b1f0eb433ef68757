"""``corral run --hosts local:N`` sends each agent it started ahead its node's plan
(:func:`corral.job.headstart.head_plans`, :meth:`~corral.job.headstart.HeadStart.prestart`)
before the engine is imported: the node's processes start held at their gates from
then on. Real agents and ranks (``--launcher python``, stdlib scripts); the job
built as ``corral run`` builds it, its checklist replaced at its seam.

* the plan sent ahead is the one the engine makes (but what is read after the
  gates: the master port each picked): the processes held before the job was even
  built are the ones that run the script, with the engine's port;
* a plan sent ahead that the engine's does not match (a variable the processes
  read at their start): they are killed and the engine's plan is started, and runs;
* the checklist fails, or the job is never run: nothing ran, nothing is left.
"""

from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import psutil
import pytest

from corral.cluster import load_cluster
from corral.errors import CheckFailed
from corral.job.build import job_spec, ready_job
from corral.job.describe import JobOptions, describe
from corral.job.engine import Job
from corral.job.headstart import HeadStart, head_plans
from corral.job.states import JobState
from tests.integration.test_prestart_local import held_processes

WAIT = 90.0  # a bound for a busy machine, never reached when it works
SCRIPT = """
import os, sys
with open(os.path.join(sys.argv[1], "ran-" + os.environ["RANK"]), "w") as fh:
    fh.write(f"{os.getpid()} {os.environ.get('HEAD_ONLY', '-')} {os.environ['MASTER_PORT']}")
"""


async def _held(job_id: str, count: int) -> list[int]:
    """The pids of the job's ``count`` processes held at their gates (empty when they
    were not all started)."""
    deadline = time.monotonic() + WAIT
    while time.monotonic() < deadline:
        pids = sorted(p.pid for p in held_processes(job_id))
        if len(pids) >= count:
            return pids
        await asyncio.sleep(0.05)
    return []


def _run(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    job_id: str,
    *,
    ahead: dict[str, str] | None = None,
    fail: bool = False,
    run: bool = True,
) -> dict[str, Any]:
    """A ``local:2`` job whose agents were started ahead and sent the head start's
    plan (its nodes' variables updated with ``ahead``) before the job is built and runs
    (``run``; ``fail``: its checklist fails). What was held before the engine was
    imported, and the outcome."""
    seen: dict[str, Any] = {}

    async def checklist(self: Job, prepared: Any, transport: Any, sync: Any) -> Any:
        seen["port"] = str(prepared.spec.master_port)  # the engine's plan's
        if fail:
            raise CheckFailed([])
        return SimpleNamespace(cluster=self.cluster, interfaces={})

    monkeypatch.setattr(Job, "_checklist", checklist)
    script = tmp_path / "train.py"
    script.write_text(SCRIPT)
    options = JobOptions(
        command=(str(script), str(tmp_path)),
        launcher="python",
        job_id=job_id,
        master_port=0,
        run_dir=str(tmp_path / "runs"),
    )
    cluster = load_cluster("local:2")

    async def main() -> None:
        head = HeadStart()
        try:
            await head.spawn(cluster, None, job_id)
            plans = head_plans(job_spec(options), cluster)
            for node in plans.values():
                node["env"].update(ahead or {})
            head.prestart(plans)
            seen["held"] = await _held(job_id, 2)  # before the job was built
            job = ready_job(describe(options, cluster), transport=head)
            if run:
                try:
                    seen["result"] = await asyncio.wait_for(job.run(), 2 * WAIT)
                except CheckFailed as exc:
                    seen["error"] = exc
        finally:
            await head.close()

    asyncio.run(main())
    ran = {}
    for rank in (0, 1):
        path = tmp_path / f"ran-{rank}"
        if path.exists():
            pid, head_only, port = path.read_text().split()
            ran[rank] = (int(pid), head_only, port)
    seen["ran"] = ran
    return seen


def _gone(pids: list[int]) -> bool:
    return not any(psutil.pid_exists(pid) for pid in pids)


def test_the_processes_started_with_the_plan_sent_ahead_run_the_job(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    seen = _run(tmp_path, monkeypatch, "ahead-same")
    assert len(seen["held"]) == 2  # held at their gates before the engine probed
    assert seen["result"].state == JobState.SUCCEEDED, seen["result"].reason
    assert sorted(pid for pid, _, _ in seen["ran"].values()) == seen["held"]
    # the plan that runs is the engine's (the one its checklist confirmed)
    assert [port for _, _, port in seen["ran"].values()] == [seen["port"]] * 2


def test_a_plan_sent_ahead_that_is_not_the_jobs_is_replaced_by_the_jobs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    seen = _run(tmp_path, monkeypatch, "ahead-other", ahead={"HEAD_ONLY": "1"})
    assert len(seen["held"]) == 2
    assert seen["result"].state == JobState.SUCCEEDED, seen["result"].reason
    # the engine's plan ran: without the variable, in other processes; the first are gone
    assert [head_only for _, head_only, _ in seen["ran"].values()] == ["-", "-"]
    assert not {pid for pid, _, _ in seen["ran"].values()} & set(seen["held"])
    assert _gone(seen["held"])


@pytest.mark.parametrize("run", [True, False], ids=["checklist-fails", "never-run"])
def test_a_plan_sent_ahead_runs_nothing_and_leaves_nothing_when_the_job_does_not_start(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, run: bool
) -> None:
    job_id = f"ahead-stopped-{int(run)}"
    seen = _run(tmp_path, monkeypatch, job_id, fail=True, run=run)
    assert len(seen["held"]) == 2
    if run:
        assert isinstance(seen.get("error"), CheckFailed)
    assert seen["ran"] == {} and list(tmp_path.glob("ran-*")) == []  # the script never ran
    assert _gone(seen["held"]) and held_processes(job_id) == []
    nodes = tmp_path / "runs" / job_id / "nodes"
    assert not nodes.exists() or os.listdir(nodes) == []
