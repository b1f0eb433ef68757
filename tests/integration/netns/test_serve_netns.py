"""`corral serve` over real HTTP against the netns testbed's hosts (real sshd).

A real server process (``tests.serverlib``) registers tb1 and tb2, checks their
health, plans, dispatches, follows, stops and queues jobs on them; one test kills
the server mid-job and starts it again (the job must go on and be re-attached),
another kills a job's supervisor process (the job must be ``lost`` and nothing may
be left on the hosts).

The module shares one server, with tb1 and tb2 registered and health-checked once
(each start costs ~1.7 CPU-s, a health check ~0.2; issue 30): every test begins with
both machines online and free, and after each test the jobs it started are torn down
and the machines free again.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import psutil
import pytest

from corral.testbed import Testbed
from tests.serverlib import LiveServer, follow_events, live_server, wait_status

from ..conftest import REPO, job_processes
from .conftest import shared_root

pytestmark = pytest.mark.netns

HOSTS = ("tb1", "tb2")
ALL_HOSTS = ("tb1", "tb2", "tb3")
TRAIN = str(REPO / "examples" / "train_ddp.py")
FINAL = ("succeeded", "failed", "timed_out", "cancelled", "lost")

#: A rank that prints and reports a step every PAUSE seconds (no torch: quick to start).
PROGRESS_SCRIPT = """\
import os, sys, time
sys.path.insert(0, {src!r})
from corral import sdk
steps, pause = int(sys.argv[1]), float(sys.argv[2])
rank = int(os.environ["RANK"])
for step in range(1, steps + 1):
    print(f"rank {{rank}} step {{step}}", flush=True)
    sdk.report(step, steps)
    time.sleep(pause)
print(f"rank {{rank}} done", flush=True)
"""


# -- helpers ---------------------------------------------------------------------------


@pytest.fixture(scope="module")
def module_server(testbed: Testbed) -> Iterator[LiveServer]:
    """The module's ``corral serve`` reaching the testbed, tb1 and tb2 registered and
    checked online (in a directory every host sees, removed after)."""
    root = shared_root(testbed)
    root.mkdir(exist_ok=True)
    path = Path(tempfile.mkdtemp(prefix="serve-", dir=root))
    try:
        with live_server(path / "srv", args=["--ssh-config", str(testbed.ssh_config)]) as srv:
            _register(srv)
            yield srv
    finally:
        shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def server(module_server: LiveServer) -> Iterator[LiveServer]:
    """The module's server (started again if a test left it killed) with tb1 and tb2
    online and free; every job the test started is torn down after, and the machines
    are free again before the next test."""
    srv = module_server
    if srv.proc is None or srv.proc.poll() is not None:
        srv.start()
    before = _jobs(srv)
    try:
        yield srv
    finally:
        _teardown_jobs(srv, _jobs(srv) - before)


def _jobs(srv: LiveServer) -> set[str]:
    """The ids of the jobs in the server's run dir."""
    return {p.name for p in srv.run_dir.iterdir()} if srv.run_dir.is_dir() else set()


def _teardown_jobs(srv: LiveServer, jobs: set[str]) -> None:
    """Take down what a failed test may have left: its queued and running jobs
    (cancelled), supervisors and their jobs' processes (killed); then wait until the
    server has freed the machines."""
    alive = srv.proc is not None and srv.proc.poll() is None  # a test may have killed it
    if alive:
        with srv.client() as client:
            for job in client.get("/api/jobs").json()["jobs"]:
                if job["status"] not in FINAL:
                    stop = f"/api/network/distributed/stop/{job['job_id']}"
                    client.post(stop, params={"force": "true"})
    for job_id in jobs:
        sup = _supervisor(srv, job_id)
        if sup is not None:
            sup.kill()
        for proc in job_processes(job_id):
            proc.kill()
    if alive:
        with srv.client() as client:
            deadline = time.monotonic() + 60
            while _ok(client.get("/api/network/status"))["busy"] and time.monotonic() < deadline:
                time.sleep(0.2)


def _supervisor(srv: LiveServer, job_id: str) -> psutil.Process | None:
    """The job's live supervisor process (``python -m corral.service.launch``)."""
    try:
        recorded = json.loads((srv.run_dir / job_id / "supervisor.json").read_text())
        proc = psutil.Process(int(recorded["pid"]))
        if "corral.service.launch" in proc.cmdline() and proc.status() != psutil.STATUS_ZOMBIE:
            return proc
    except (OSError, ValueError, KeyError, psutil.Error):
        pass
    return None


def _ok(resp: httpx.Response, status: int = 200) -> Any:
    assert resp.status_code == status, (resp.status_code, resp.text)
    return resp.json()


def _register(srv: LiveServer) -> None:
    """Register tb1 and tb2 with ``srv`` and health-check them (online)."""
    with srv.client() as client:
        for name in HOSTS:
            _ok(client.post("/api/network/machines", json={"name": name, "slots": 1}), 201)
        _health_check(client)


def _health_check(client: httpx.Client) -> dict[str, Any]:
    """Check the machines' health now; every one must be online."""
    status: dict[str, Any] = _ok(client.post("/api/network/health-check"))
    assert {m["name"]: m["status"] for m in status["machines"]} == dict.fromkeys(HOSTS, "online"), (
        status
    )
    return status


def _registered(srv: LiveServer) -> httpx.Client:
    """A client of ``srv``, whose machines tb1 and tb2 are online and run no job."""
    client = srv.client()
    status = _ok(client.get("/api/network/status"))
    assert (status["total"], status["online"], status["busy"]) == (2, 2, 0), status
    return client


def _progress_script(tmp_path: Path) -> str:
    path = tmp_path / "progress.py"
    path.write_text(PROGRESS_SCRIPT.format(src=str(REPO / "src")))
    return str(path)


def _request(script: str, *args: str, launcher: str = "python", **extra: Any) -> dict[str, Any]:
    """A job on both machines, one rank each."""
    return {
        "script": script,
        "args": list(args),
        "launcher": launcher,
        "nproc_per_node": 1,
        "resource_requirements": {"num_machines": 2},
        "preflight": False,
        **extra,
    }


def _dispatch(client: httpx.Client, request: dict[str, Any]) -> str:
    planned = _ok(client.post("/api/network/distributed/plan", json=request))
    _ok(client.post("/api/network/distributed/dispatch", json={"job_id": planned["job_id"]}))
    return str(planned["job_id"])


def _step(status: dict[str, Any]) -> int:
    """The lowest step every node reported (0 before any report)."""
    steps = [n["progress"]["step"] for n in status["nodes"]]
    return min((s or 0) for s in steps) if steps else 0


def _wait_step(client: httpx.Client, job_id: str, step: int, timeout: float = 90) -> int:
    """Wait until every node reported at least ``step``; the lowest step then."""
    deadline = time.monotonic() + timeout
    status: dict[str, Any] = {}
    while time.monotonic() < deadline:
        status = _ok(client.get(f"/api/network/distributed/status/{job_id}"))
        assert status["status"] in ("pending", "preparing", "starting", "running"), status
        if len(status["nodes"]) == len(HOSTS) and _step(status) >= step:
            return _step(status)
        time.sleep(0.2)
    raise AssertionError(f"job {job_id} did not reach step {step} in {timeout} s: {status}")


def _ended(client: httpx.Client, job_id: str, within: float = 10) -> dict[str, Any]:
    """The job's status once it has ended. The server ingests the events file every
    fraction of a second, so its status may trail the SSE stream (read from the file)
    by that much."""
    return wait_status(client, job_id, ["succeeded", "failed", "cancelled", "lost"], within)


def _job_of(pid: int) -> str | None:
    try:
        return psutil.Process(pid).environ().get("CORRAL_JOB_ID")
    except psutil.Error:
        return None


def _on_hosts(tb: Testbed, job_id: str, within: float = 0.0) -> dict[str, list[int]]:
    """The job's processes on each testbed host (asked per host namespace), polled until
    none is left or ``within`` seconds pass."""
    deadline = time.monotonic() + within
    while True:
        found = {h: [p for p in tb.pids_on(h) if _job_of(p) == job_id] for h in ALL_HOSTS}
        found = {h: pids for h, pids in found.items() if pids}
        if not found or time.monotonic() >= deadline:
            return found
        time.sleep(0.2)


# -- machines and health ---------------------------------------------------------------


def test_machines_health_and_errors(server: LiveServer) -> None:
    client = _registered(server)
    _health_check(client)
    machines = _ok(client.get("/api/network/machines"))
    assert [m["name"] for m in machines] == list(HOSTS)
    for m in machines:
        assert m["host"] == m["name"] and m["last_error"] is None
        assert m["capabilities"]["cpus"] >= 1, m
        assert m["capabilities"]["memory_bytes"] > 0, m
        assert m["capabilities"]["hostname"] == m["name"]  # it reached the host itself
        assert m["last_seen"] is not None and m["latency_ms"] is not None
    status = _ok(client.get("/api/network/status"))
    assert (status["total"], status["online"], status["busy"], status["offline"]) == (2, 2, 0, 0)

    dup = client.post("/api/network/machines", json={"name": "tb1", "slots": 4})
    assert dup.status_code == 409 and dup.json()["error"]["type"] == "conflict", dup.text
    assert "tb1" in dup.json()["error"]["message"]
    missing = client.get("/api/network/machines/m-0000000000")
    assert missing.status_code == 404, missing.text
    error = missing.json()["error"]
    assert error["type"] == "not_found" and "m-0000000000" in error["message"], error
    assert client.get("/api/network/distributed/status/no-such-job").status_code == 404

    anonymous = httpx.get(f"{server.url}/api/network/machines", timeout=30)
    assert anonymous.status_code == 401 and "error" in anonymous.json(), anonymous.text
    wrong = httpx.get(
        f"{server.url}/api/network/status", headers={"Authorization": "Bearer nope"}, timeout=30
    )
    assert wrong.status_code == 401
    assert len(_ok(client.get("/api/network/machines"))) == 2  # nothing changed


# -- a real 2-node DDP job ---------------------------------------------------------------


@pytest.mark.torch
@pytest.mark.slow
def test_ddp_job_plan_dispatch_follow_and_files(server: LiveServer, testbed: Testbed) -> None:
    client = _registered(server)
    request = _request(
        TRAIN,
        "--steps",
        "30",
        launcher="torchrun",
        preflight=True,
        workdir=str(REPO / "examples"),  # the code check compares this tree with
        code_dir=str(REPO / "examples"),  # the server's copy, not with the server's cwd
        machine_selection="manual",
        selected_machines=list(HOSTS),  # node 0 on tb1
    )
    planned = _ok(client.post("/api/network/distributed/plan", json=request))
    job_id, plan = planned["job_id"], planned["execution_plan"]
    assert planned["status"] == "planned"
    assert [m["name"] for m in plan["machines"]] == list(HOSTS)
    assert plan["world_size"] == 2 and plan["launcher"] == "torchrun"
    assert plan["master"]["host"] == "tb1" and plan["master"]["address"], plan["master"]
    assert [n["host"] for n in plan["nodes"]] == list(HOSTS)
    for node in plan["nodes"]:
        lines = " ".join(c["line"] for c in node["commands"])
        assert "torch" in lines and TRAIN in lines, node
    assert _ok(client.get(f"/api/network/distributed/status/{job_id}"))["status"] == "planned"

    dispatched = _ok(client.post("/api/network/distributed/dispatch", json={"job_id": job_id}))
    assert dispatched["status"] not in ("planned", "failed", "lost"), dispatched
    again = client.post("/api/network/distributed/dispatch", json={"job_id": job_id})
    assert again.status_code == 409, again.text  # dispatched once only

    events = follow_events(client, job_id, timeout=240)
    kinds = [kind for _, kind, _ in events]
    data = [json.loads(d) for _, _, d in events]
    assert kinds[-1] == "finished", json.dumps(data[-3:], indent=1)
    assert data[-1]["state"] == "succeeded" and data[-1]["exit_code"] == 0, data[-1]
    assert {d["host"] for k, d in zip(kinds, data, strict=True) if k == "log"} >= set(HOSTS)
    progress = [d for k, d in zip(kinds, data, strict=True) if k == "progress"]
    assert {d["host"] for d in progress} == set(HOSTS)
    assert max(d["step"] for d in progress) == 30 and progress[-1]["total"] == 30
    # byte offsets, resumable: increasing, none twice; only the stream's own notes (the
    # folded teardown's, one per node resuming at one event) may carry none but the last
    ids = [int(i) for i, _, _ in events if i]
    assert ids == sorted(ids) and len(set(ids)) == len(ids)
    assert all(kind == "message" for i, kind, _ in events if not i), events

    status = _ended(client, job_id)
    assert status["status"] == "succeeded" and status["exit_code"] == 0, status
    assert [(n["host"], n["status"]) for n in status["nodes"]] == [
        ("tb1", "exited"),
        ("tb2", "exited"),
    ]
    assert all(n["end_time"] is not None for n in status["nodes"])
    assert status["started"] <= status["ended"]
    assert status["last_metrics"]["step"] == 30 and "loss" in status["last_metrics"]

    out = _ok(client.get(f"/api/network/local_job_output/{job_id}", params={"limit": 100000}))
    assert out["finished"] is True
    text = "\n".join(out["lines"])
    assert any(line.startswith("[tb1:0] ") for line in out["lines"]), text[-3000:]
    assert any(line.startswith("[tb2:1] ") for line in out["lines"]), text[-3000:]
    assert "final loss" in text

    result = client.get(f"/api/network/local_job_file/{job_id}/result")
    assert result.status_code == 200, result.text
    assert result.json()["state"] == "succeeded"
    token = server.token_file.read_text().strip()
    # httpx removes a plain "../" before sending; encoded, it reaches the route's guard
    escapes = {"../../token": (403, 404), "..%2F..%2Ftoken": (403,), "%2e%2e/%2e%2e/token": (403,)}
    for key, codes in {**escapes, "/etc/passwd": (403,)}.items():
        escaped = client.get(f"/api/network/local_job_file/{job_id}/{key}")
        assert escaped.status_code in codes, (key, escaped.status_code, escaped.text)
        assert "error" in escaped.json(), escaped.text
        assert token not in escaped.text and "root:" not in escaped.text
    assert not _on_hosts(testbed, job_id, within=30)


# -- stop ------------------------------------------------------------------------------


def test_stop_tears_down_every_host(server: LiveServer, testbed: Testbed, tmp_path: Path) -> None:
    client = _registered(server)
    job_id = _dispatch(client, _request(_progress_script(tmp_path), "100000", "0.2"))
    _wait_step(client, job_id, 3)
    assert set(_on_hosts(testbed, job_id)) == set(HOSTS)  # it runs on both
    supervisor = _supervisor(server, job_id)
    assert supervisor is not None

    stopped = _ok(client.post(f"/api/network/distributed/stop/{job_id}"))
    assert stopped["stopping"] is True, stopped
    status = _ended(client, job_id, within=30)
    assert status["status"] == "cancelled", status
    _, last, data = follow_events(client, job_id, timeout=30)[-1]
    assert last == "finished" and json.loads(data)["state"] == "cancelled", data
    assert not _on_hosts(testbed, job_id, within=30)
    supervisor.wait(30)  # and so does the supervisor (psutil.TimeoutExpired if not)

    again = _ok(client.post(f"/api/network/distributed/stop/{job_id}"))
    assert again["stopping"] is False and again["status"] == "cancelled", again
    machines = _ok(client.get("/api/network/status"))
    assert machines["busy"] == 0 and machines["online"] == 2, machines


# -- the server and the supervisor die ---------------------------------------------------


@pytest.mark.slow
def test_server_killed_mid_job_reattaches(
    server: LiveServer, testbed: Testbed, tmp_path: Path
) -> None:
    client = _registered(server)
    job_id = _dispatch(client, _request(_progress_script(tmp_path), "60", "0.25"))
    before = _wait_step(client, job_id, 3)
    supervisor = _supervisor(server, job_id)
    assert supervisor is not None

    server.kill()
    time.sleep(1.0)  # the job goes on without the server
    assert supervisor.is_running() and set(_on_hosts(testbed, job_id)) == set(HOSTS)
    server.start()
    client = server.client()

    status = _ok(client.get(f"/api/network/distributed/status/{job_id}"))
    assert status["status"] == "running", status  # re-attached, not lost
    events = follow_events(client, job_id, timeout=120)
    assert events[-1][1] == "finished", events[-5:]
    status = _ended(client, job_id)
    assert status["status"] == "succeeded" and status["exit_code"] == 0, status
    assert _step(status) == 60 > before  # the events written after the restart arrived
    out = _ok(client.get(f"/api/network/local_job_output/{job_id}", params={"limit": 100000}))
    for node in status["nodes"]:  # every rank's last line, printed after the restart
        rank = node["node_rank"]
        assert f"[{node['host']}:{rank}] rank {rank} done" in out["lines"], out["lines"][-10:]
    assert not _on_hosts(testbed, job_id, within=30)


def test_killed_supervisor_is_lost_and_leaves_nothing(
    server: LiveServer, testbed: Testbed, tmp_path: Path
) -> None:
    client = _registered(server)
    job_id = _dispatch(client, _request(_progress_script(tmp_path), "100000", "0.2"))
    _wait_step(client, job_id, 3)
    supervisor = _supervisor(server, job_id)
    assert supervisor is not None
    assert set(_on_hosts(testbed, job_id)) == set(HOSTS)

    os.kill(supervisor.pid, signal.SIGKILL)
    status = _ended(client, job_id, within=30)
    assert status["status"] == "lost", status
    assert "supervisor" in status["reason"] and str(supervisor.pid) in status["reason"]
    _, last, data = follow_events(client, job_id, timeout=30)[-1]  # the stream ends with it
    assert last == "lost" and json.loads(data)["reason"] == status["reason"], data
    assert not _on_hosts(testbed, job_id, within=40)  # the agents lost their coordinator
    machines = _ok(client.get("/api/network/status"))
    assert machines["busy"] == 0, machines  # a lost job frees its machines


# -- the queue -------------------------------------------------------------------------


def test_queued_tasks_run_one_after_the_other(server: LiveServer, tmp_path: Path) -> None:
    client = _registered(server)
    request = _request(_progress_script(tmp_path), "15", "0.2")
    task = _ok(client.post("/api/tasks", json={"name": "both", "request": request}), 201)
    first = _ok(client.get(f"/api/tasks/{task['id']}/queue_distributed"))
    second = _ok(client.get(f"/api/tasks/{task['id']}/queue_distributed"))
    assert first["job_id"] != second["job_id"] and second["status"] == "queued"

    running = wait_status(client, first["job_id"], ["running"], 60)
    assert running["task_id"] == task["id"]
    waiting = _ok(client.get(f"/api/network/distributed/status/{second['job_id']}"))
    assert waiting["status"] == "queued", waiting
    network = _ok(client.get("/api/network/status"))
    assert network["busy"] == 2, network
    assert all(m["running_jobs"] == [first["job_id"]] for m in network["machines"])

    done = [_ended(client, q["job_id"], within=120) for q in (first, second)]
    assert [d["status"] for d in done] == ["succeeded", "succeeded"], done
    assert done[1]["started"] >= done[0]["ended"] - 0.5, done  # never both at once
    listed = _ok(client.get("/api/jobs", params={"task_id": task["id"]}))
    assert {j["job_id"] for j in listed["jobs"]} == {first["job_id"], second["job_id"]}
