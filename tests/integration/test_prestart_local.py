"""A local launch starts its nodes' processes while the pre-flight checklist runs,
held at their gates (corral.agent.prestart): real agents and ranks, the checklist
replaced at its seam (``Job._checklist``) by one that waits until it sees them.

* the checklist passes: the processes it saw held (the script not yet run) are the
  ones that run the script;
* the checklist fails: they are gone, the script never ran, the nodes' directories
  are not left behind;
* torchrun: the held launcher imports torch before the checklist ends;
* hosts reached through a transport (the SSH path, here a local one): each host's
  plan follows its probe, and the held ranks run the script with the start
  message's environment (the interface the checks found).
"""

from __future__ import annotations

import asyncio
import contextlib
import sys
import time
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import psutil
import pytest

from corral.cluster import Cluster, Host, load_cluster
from corral.errors import CheckFailed
from corral.job.engine import Job
from corral.job.options import SupervisionPolicy
from corral.job.states import JobState
from corral.plan.spec import JobSpec
from corral.transport.local import LocalTransport

WAIT = 90.0  # a bound for a busy machine, never reached when it works
SCRIPT = """
import os, sys
with open(os.path.join(sys.argv[1], "ran-" + os.environ["RANK"]), "w") as fh:
    fh.write(str(os.getpid()))
with open(os.path.join(sys.argv[1], "env-" + os.environ["RANK"]), "w") as fh:
    fh.write(os.environ.get("GLOO_SOCKET_IFNAME", "-"))
"""


def held_processes(job_id: str) -> list[psutil.Process]:
    """The processes of ``job_id`` waiting at a gate (started through corral.agent.gate)."""
    found = []
    for proc in psutil.process_iter(["cmdline"]):
        with contextlib.suppress(psutil.Error):
            gated = "corral.agent.gate" in (proc.info["cmdline"] or [])
            if gated and proc.environ().get("CORRAL_JOB_ID") == job_id:
                found.append(proc)
    return found


def checklist_waiting_for(
    job_id: str, count: int, seen: dict[str, Any], ready: Callable[[psutil.Process], bool]
) -> Any:
    """A checklist that ends once ``count`` held processes of the job are ``ready``,
    keeping what it saw in ``seen``; ``seen["fail"]``: it fails then."""

    async def checklist(self: Job, prepared: Any, transport: Any, sync: Any) -> Any:
        deadline = time.monotonic() + WAIT
        while time.monotonic() < deadline:
            procs = [p for p in held_processes(job_id) if ready(p)]
            if len(procs) >= count:
                seen["pids"] = sorted(p.pid for p in procs)
                break
            await asyncio.sleep(0.05)
        seen["ran"] = sorted(p.name for p in Path(seen["out"]).glob("ran-*"))
        if seen.get("fail"):
            raise CheckFailed([])
        return SimpleNamespace(cluster=self.cluster, interfaces=seen.get("interfaces", {}))

    return checklist


def run_held(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    launcher: Any,
    nodes: int,
    count: int,
    ready: Callable[[psutil.Process], bool] = bool,
    fail: bool = False,
) -> dict[str, Any]:
    """Run a ``local:nodes`` job whose checklist waits for ``count`` held processes;
    what the checklist saw, and the job's ``result`` (or ``error``)."""
    job_id = f"held-{launcher}-{nodes}-{int(fail)}"
    seen: dict[str, Any] = {"out": tmp_path, "fail": fail}
    monkeypatch.setattr(Job, "_checklist", checklist_waiting_for(job_id, count, seen, ready))
    script = tmp_path / "train.py"
    script.write_text(SCRIPT)
    spec = JobSpec(
        script=str(script),
        args=(str(tmp_path),),
        launcher=launcher,
        job_id=job_id,
        master_port=0,
        run_dir=str(tmp_path / "runs"),
    )
    job = Job(spec, load_cluster(f"local:{nodes}"), supervision=SupervisionPolicy(grace=5.0))
    try:
        seen["result"] = asyncio.run(asyncio.wait_for(job.run(), 2 * WAIT))
    except CheckFailed as exc:
        seen["error"] = exc
    seen["job_id"] = job_id
    return seen


def test_ranks_start_held_during_the_checklist_and_run_the_script(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    seen = run_held(tmp_path, monkeypatch, "python", 2, 2)
    assert seen["result"].state == JobState.SUCCEEDED, seen["result"].reason
    assert len(seen.get("pids", [])) == 2  # both ranks were running before the checks ended
    assert seen["ran"] == []  # ... and none had run the script
    ran = sorted(int((tmp_path / f"ran-{rank}").read_text()) for rank in (0, 1))
    assert ran == seen["pids"]  # the held processes are the ones that ran it


def test_a_failed_checklist_leaves_no_process_and_runs_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    seen = run_held(tmp_path, monkeypatch, "python", 2, 2, fail=True)
    assert isinstance(seen.get("error"), CheckFailed)
    assert len(seen.get("pids", [])) == 2 and seen["ran"] == []
    for pid in seen["pids"]:
        assert not psutil.pid_exists(pid)
    assert held_processes(seen["job_id"]) == []
    assert list(tmp_path.glob("ran-*")) == []  # the script never ran
    nodes = tmp_path / "runs" / seen["job_id"] / "nodes"
    assert not nodes.exists() or list(nodes.iterdir()) == []


def _imported_torch(proc: psutil.Process) -> bool:
    try:
        return any("libtorch" in m.path for m in proc.memory_maps())
    except psutil.Error:
        return False


@pytest.mark.torch
def test_the_held_torchrun_imports_torch_before_the_checklist_ends(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    seen = run_held(tmp_path, monkeypatch, "torchrun", 1, 1, _imported_torch)
    assert seen["result"].state == JobState.SUCCEEDED, seen["result"].reason
    assert len(seen.get("pids", [])) == 1 and seen["ran"] == []
    assert (tmp_path / "ran-0").exists()


def test_hosts_behind_a_transport_start_held_after_their_probe(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HOME", str(tmp_path))  # the nodes' directories: ~/.corral/runs
    seen: dict[str, Any] = {"out": tmp_path, "interfaces": {"h1": "lo"}}
    monkeypatch.setattr(Job, "_checklist", checklist_waiting_for("held4", 2, seen, bool))
    script = tmp_path / "train.py"
    script.write_text(SCRIPT)
    spec = JobSpec(
        script=str(script),
        args=(str(tmp_path),),
        launcher="python",
        job_id="held4",
        master_port=0,
        workdir=str(tmp_path),
        python=sys.executable,
        run_dir=str(tmp_path / "runs"),
    )
    host = Host("h1", address="127.0.0.1", slots=2)  # two ranks on it
    transport = LocalTransport()
    job = Job(spec, Cluster((host,)), supervision=SupervisionPolicy(grace=5.0), transport=transport)

    async def main() -> Any:
        try:
            return await asyncio.wait_for(job.run(), 2 * WAIT)
        finally:
            await transport.close()

    result = asyncio.run(main())
    assert result.state == JobState.SUCCEEDED, result.reason
    assert len(seen.get("pids", [])) == 2 and seen["ran"] == []
    ran = sorted(int((tmp_path / f"ran-{rank}").read_text()) for rank in (0, 1))
    assert ran == seen["pids"]
    # the interface the checks found reached the held ranks through their gate
    assert [(tmp_path / f"env-{rank}").read_text() for rank in (0, 1)] == ["lo", "lo"]
