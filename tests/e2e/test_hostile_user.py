"""A hostile team member against a real ``corral serve`` over real HTTP: the holes a
``user`` (and an unauthenticated client) found after the trust boundary of issue 29,
each kept shut. The server's data dir is its working dir here (its token, its
database), as when an admin starts ``corral serve`` in ``~/.corral``."""

from __future__ import annotations

import json
import os
import pickle
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.serverlib import TOKEN, LiveServer, live_server, wait_status

SSH_HOST = "10.9.9.9"  # never reachable: a user's job for it stays queued, nothing starts
QUEUED_JOB = {
    "launcher": "command",
    "command_template": "echo hi",
    "preflight": False,
    "machine_selection": "manual",
    "selected_machines": ["gpu1"],
}


@dataclass
class Team:
    server: LiveServer
    admin: httpx.Client
    mallory: httpx.Client  # a user

    def close(self) -> None:
        self.admin.close()
        self.mallory.close()


@pytest.fixture(scope="module")
def team(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Team]:
    root = tmp_path_factory.mktemp("hostile") / "srv"
    with live_server(root) as server:
        admin = server.client()
        for body in ({"name": "here", "local": True}, {"name": "gpu1", "host": SSH_HOST}):
            made = admin.post("/api/network/machines", json=body)
            assert made.status_code == 201, made.text
        user = admin.post("/api/users", json={"name": "mallory", "role": "user"})
        assert user.status_code == 201, user.text
        mallory = httpx.Client(
            base_url=server.url,
            timeout=60,
            headers={"Authorization": f"Bearer {user.json()['token']}"},
        )
        team = Team(server, admin, mallory)
        try:
            yield team
        finally:
            team.close()


def test_a_queued_jobs_files_are_not_the_servers_working_dir(team: Team) -> None:
    """A queued job has no run dir yet; its files are none, not those of the server's
    working dir (where its token and database are)."""
    queued = team.mallory.post("/api/jobs/queue", json=QUEUED_JOB)
    assert queued.status_code == 201, queued.text
    job_id = queued.json()["job_id"]
    assert queued.json()["status"] == "queued"

    listed = team.mallory.get(f"/api/jobs/{job_id}/files")
    assert listed.status_code == 200, listed.text
    assert listed.json() == []
    for key in ("token", "corral.db", "serve.log", "./token"):
        answer = team.mallory.get(f"/api/network/local_job_file/{job_id}/{key}")
        assert answer.status_code == 404, (key, answer.status_code, answer.text[:200])
        assert TOKEN not in answer.text
        assert not answer.content.startswith(b"SQLite format")


def test_a_file_name_too_long_is_a_404_not_a_500(team: Team) -> None:
    """A key longer than the filesystem allows is no such file (not an OSError 500)."""
    plan = team.admin.post(
        "/api/network/distributed/plan",
        json={**QUEUED_JOB, "command_template": "true", "selected_machines": ["here"]},
    )
    assert plan.status_code == 200, plan.text
    job_id = plan.json()["job_id"]
    started = team.admin.post("/api/network/distributed/dispatch", json={"job_id": job_id})
    assert started.status_code == 200, started.text
    wait_status(team.admin, job_id, ["succeeded"])
    answer = team.admin.get(f"/api/network/local_job_file/{job_id}/{'a' * 5000}")
    assert answer.status_code == 404, answer.text[:300]


@pytest.mark.parametrize(
    "target",
    [
        "mlflow:sqlite://localhost/{root}/owned.db",  # SQLAlchemy ignores the host
        "mlflow:sqlite:///%2e%2e/%2e%2e/%2e%2e/owned.db",  # SQLAlchemy decodes %2e
        "mlflow:file:%2e%2e/%2e%2e/%2e%2e/owned",  # so does MLflow
    ],
)
def test_a_tracking_target_spelled_otherwise_still_stays_in_bounds(team: Team, target: str) -> None:
    """What the tracker will open (the host of a sqlite URL dropped, the path
    percent-decoded) is what the allow-list checks: outside the job's run dir is a 403."""
    track = target.format(root=team.server.root)
    answer = team.mallory.post("/api/jobs/queue", json={**QUEUED_JOB, "track": [track]})
    assert answer.status_code == 403, answer.text
    assert answer.json()["error"]["details"]["rule"] == "tracking-allow-list"


def _client(server: LiveServer, token: str) -> httpx.Client:
    return httpx.Client(
        base_url=server.url, timeout=60, headers={"Authorization": f"Bearer {token}"}
    )


def test_a_plan_made_as_an_admin_is_not_dispatched_once_its_owner_is_a_user(team: Team) -> None:
    """eve plans a job on the server's own host while an admin; her grant is revoked and
    the name re-added as a user: dispatching the old plan is a 403, not a job that runs
    as the server next to its token (dispatch checks its owner's rights as they are)."""
    made = team.admin.post("/api/users", json={"name": "eve", "role": "admin"})
    assert made.status_code == 201, made.text
    with _client(team.server, made.json()["token"]) as eve:
        plan = eve.post(
            "/api/network/distributed/plan",
            json={
                **QUEUED_JOB,
                "command_template": f"cat {team.server.token_file}",
                "selected_machines": ["here"],
            },
        )
    assert plan.status_code == 200, plan.text
    job_id = plan.json()["job_id"]
    assert team.admin.delete("/api/users/eve").status_code == 200
    again = team.admin.post("/api/users", json={"name": "eve", "role": "user"})
    assert again.status_code == 201, again.text
    with _client(team.server, again.json()["token"]) as eve:
        answer = eve.post("/api/network/distributed/dispatch", json={"job_id": job_id})
        assert answer.status_code == 403, answer.text
        assert answer.json()["error"]["details"]["rule"] == "server-host"
        status = eve.get(f"/api/network/distributed/status/{job_id}").json()
        assert status["status"] == "planned"
        output = eve.get(f"/api/network/local_job_output/{job_id}")
        assert TOKEN not in output.text


class _Runs:
    """A pickle that runs ``touch PATH`` when unpickled (what a rank could write as its
    flight recorder dump)."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def __reduce__(self) -> tuple[Any, tuple[str]]:
        return (os.system, (f"touch {self.path}",))


def _dump(entries: list[Any]) -> bytes:
    """A flight recorder dump as torch's gloo recorder writes it (plain data)."""
    return pickle.dumps(
        {
            "version": "2.10",
            "pg_config": {"": {"name": "", "desc": "", "ranks": "[0]"}},
            "comm_lib_version": "",
            "pg_status": {"0": {"last_enqueued_collective": 1}},
            "entries": entries,
        }
    )


def _analysed(directory: Path) -> dict[str, Any]:
    done = subprocess.run(
        [sys.executable, "-m", "corral.diagnose.frtrace", str(directory)],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    found: dict[str, Any] = json.loads(done.stdout)
    return found


def test_a_ranks_flight_recorder_dump_never_runs_code_on_the_coordinator(tmp_path: Path) -> None:
    """A hang's flight recorder dumps come from the ranks -- the code of whoever
    submitted the job, on an SSH machine -- to the coordinator on the server's host,
    whose analyser read them with pickle: a dump naming a function ran it there as
    the server's OS user (next to its token). A dump is read as plain data only."""
    entry = {
        "frames": [{"name": "all_reduce", "filename": "train.py", "line": 3}],
        "record_id": 0,
        "pg_id": 0,
        "process_group": ("0", "default_pg"),
        "collective_seq_id": 1,
        "p2p_seq_id": 0,
        "op_id": 1,
        "profiling_name": "gloo:all_reduce",
        "input_sizes": [[2]],
        "input_dtypes": ["Float"],
        "output_sizes": [[2]],
        "output_dtypes": ["Float"],
        "state": "scheduled",
        "time_created_ns": 1,
        "time_discovered_started_ns": None,
        "time_discovered_completed_ns": None,
        "retired": True,
        "timeout_ms": 1800000,
        "is_p2p": False,
    }
    good, bad = tmp_path / "good", tmp_path / "bad"
    good.mkdir()
    bad.mkdir()
    (good / "rank_0").write_bytes(_dump([entry]))
    assert _analysed(good)["last"]["0"][0]["op"] == "gloo:all_reduce"  # a dump still reads

    marker = tmp_path / "ran"
    (bad / "rank_0").write_bytes(_dump([entry, _Runs(marker)]))
    found = _analysed(bad)
    assert not marker.exists(), "the dump ran code on the coordinator"
    assert "not loaded" in found["error"], found


def test_a_job_printing_without_end_does_not_fill_the_servers_disk(tmp_path: Path) -> None:
    """A job keeps at most CORRAL_JOB_OUTPUT_LIMIT bytes of output on the server (its
    logs and the events that carry its lines); past it one line and one warning say so."""
    limit = 200_000
    flood = "head -c 3000000 /dev/zero | tr '\\0' x | fold -w 100"  # 3 MB of lines
    env = {"CORRAL_JOB_OUTPUT_LIMIT": str(limit)}
    with live_server(tmp_path / "srv", env=env) as server, server.client() as admin:
        made = admin.post("/api/network/machines", json={"name": "here", "local": True})
        assert made.status_code == 201, made.text
        plan = admin.post(
            "/api/network/distributed/plan",
            json={**QUEUED_JOB, "command_template": flood, "selected_machines": ["here"]},
        )
        assert plan.status_code == 200, plan.text
        job_id = plan.json()["job_id"]
        started = admin.post("/api/network/distributed/dispatch", json={"job_id": job_id})
        assert started.status_code == 200, started.text
        wait_status(admin, job_id, ["succeeded"])
        job_dir = server.run_dir / job_id
        logs = sum(p.stat().st_size for p in (job_dir / "logs").glob("*.log"))
        assert logs <= limit + 1000, logs
        assert (job_dir / "events.jsonl").stat().st_size < 3 * limit
        output = admin.get(f"/api/network/local_job_output/{job_id}", params={"limit": 100000})
        assert "output passed 200000 bytes" in output.text
