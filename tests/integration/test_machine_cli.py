"""``corral machine`` and ``corral job submit --queue`` against a real ``corral serve``."""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.serverlib import TOKEN, LiveServer, free_port, live_server

from .conftest import SCRIPTS, corral_argv, job_processes

STEPS = str(SCRIPTS / "steps.py")
LOCAL = ("--launcher", "python", "--nproc-per-node", "1", "--no-preflight")


class Corral:
    """``corral ...`` runs against one server."""

    def __init__(self, server: LiveServer, home: Path) -> None:
        self.server = server
        self.env = {k: v for k, v in os.environ.items() if not k.startswith("CORRAL_")}
        self.env.update(
            COLUMNS="200",
            XDG_DATA_HOME=str(home),
            CORRAL_SERVER=server.url,
            CORRAL_TOKEN=TOKEN,
        )
        self.home = home

    def __call__(self, *args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            corral_argv(*args),
            capture_output=True,
            text=True,
            timeout=120,
            env=self.env,
            cwd=self.home,
        )


@pytest.fixture
def corral(tmp_path: Path) -> Iterator[Corral]:
    with live_server(tmp_path / "serve") as server:
        try:
            yield Corral(server, tmp_path)
        finally:
            for job in server.run_dir.glob("*") if server.run_dir.exists() else []:
                for proc in job_processes(job.name):
                    proc.kill()


def test_machine_add_list_check_rm(corral: Corral) -> None:
    empty = corral("machine", "list")
    assert empty.returncode == 0, empty.stderr
    assert "no machines: add one with `corral machine add NAME --host ADDR`" in empty.stderr
    refused = corral("job", "submit", *LOCAL, "--", STEPS)
    assert refused.returncode == 2
    assert refused.stderr.strip() == (
        "error: 1 machine needed, 0 available (0 registered): no machine is registered; add "
        "one with `corral machine add NAME --host ADDR` (or `corral machine add --local`)"
    )
    unnamed = corral("machine", "add")
    assert unnamed.returncode == 2 and unnamed.stderr.startswith("error: NAME: a machine needs")
    with corral.server.client() as http:
        answer = http.post("/api/network/machines", json={"local": True})
    assert answer.status_code == 422
    assert "every machine needs a name, a local one too" in answer.json()["error"]["message"]

    local = corral("machine", "add", "--local", "--slots", "2")  # named as local:N names nodes
    assert local.returncode == 0, local.stderr
    assert "machine local-0 (local (simulated), 2 slots) added: online" in local.stderr
    assert corral("machine", "add", "sim2", "--local", "--label", "rack=a").returncode == 0
    twice = corral("machine", "add", "sim2", "--local")
    assert twice.returncode == 2
    assert twice.stderr.strip() == "error: a machine named 'sim2' is already registered"
    closed = str(free_port())  # nothing listens there: the check says offline
    ssh = corral("machine", "add", "gpu9", "--host", "127.0.0.1", "--ssh-port", closed)
    assert ssh.returncode == 0, ssh.stderr
    assert f"machine gpu9 (127.0.0.1:{closed}, 1 slot) added: offline" in ssh.stderr
    assert "corral machine check gpu9 tries again" in ssh.stderr
    wrong = corral("machine", "add", "--local", "--host", "10.0.0.1")
    assert wrong.stderr.strip() == (
        "error: --local: a local machine is a simulated node on the server: host do not apply"
    )

    listed = corral("machine", "list")
    assert listed.returncode == 0, listed.stderr
    rows = {line.split("│")[1].strip(): line for line in listed.stdout.splitlines() if "│" in line}
    assert "online" in rows["local-0"] and "local (simulated)" in rows["local-0"]
    assert "offline" in rows["gpu9"] and f"127.0.0.1:{closed}" in rows["gpu9"]
    data = json.loads(corral("machine", "list", "--json").stdout)
    assert [m["name"] for m in data] == ["gpu9", "local-0", "sim2"]
    assert data[2]["labels"] == {"rack": "a"} and data[0]["port"] == int(closed)

    assert corral("machine", "check", "local-0", "sim2").returncode == 0
    every = corral("machine", "check")
    assert every.returncode == 1  # gpu9 does not answer
    assert "gpu9" in every.stdout and "local-0" in every.stdout

    removed = corral("machine", "rm", "gpu9", "sim2")
    assert removed.returncode == 0, removed.stderr
    assert removed.stdout.splitlines() == ["removed machine gpu9", "removed machine sim2"]
    gone = corral("machine", "rm", "gpu9")
    assert gone.returncode == 2 and gone.stderr.strip() == "error: no machine named 'gpu9'"
    left = json.loads(corral("machine", "list", "--json").stdout)
    assert [m["name"] for m in left] == ["local-0"]


def test_submit_queue_waits_for_the_busy_machine_then_runs(corral: Corral) -> None:
    assert corral("machine", "add", "q1", "--local").returncode == 0
    first = corral("job", "submit", *LOCAL, "--", STEPS)
    assert first.returncode == 0, first.stderr
    blocking = first.stdout.strip()

    busy = corral("job", "submit", *LOCAL, "--", STEPS, "--steps", "3")
    assert busy.returncode == 2
    assert busy.stderr.strip() == (
        f"error: 1 machine needed, 0 available (1 registered): q1 busy with {blocking} "
        "(--queue waits for them)"
    )

    queued = corral(
        "job", "submit", *LOCAL, "--queue", "--name", "later", "--", STEPS, "--steps", "3"
    )
    assert queued.returncode == 0, queued.stderr
    job_id = queued.stdout.strip()
    waiting = f"waiting for 1 machine: q1 busy with {blocking}"
    assert f"job {job_id} is queued: {waiting}" in queued.stderr
    status = corral("job", "status", job_id)
    assert status.returncode == 0, status.stderr
    assert f"job {job_id} (later): queued: {waiting}" in status.stdout

    assert corral("job", "stop", blocking).returncode == 0
    followed = corral("job", "logs", job_id, "-f")
    assert followed.returncode == 0, followed.stderr
    assert [x for x in followed.stdout.splitlines() if x.startswith("[q1:0]")] == [
        f"[q1:0] rank 0 step {s}" for s in range(3)
    ]
    done = json.loads(corral("job", "status", job_id, "--json").stdout)
    assert done["status"] == "succeeded" and done["machines"] == ["q1"]
