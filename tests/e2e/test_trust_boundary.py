"""The team server's trust boundary over real HTTP (a real ``corral serve``): a hostile
``user`` tries every path to the server's own host -- a job on a local machine with
each launcher, ``execute_job``, ``dispatch_job``, the queue, a task,
``prepare_dependencies``, ``sync`` of a server tree, tracking targets outside the
allow-list, another user's output -- and never reads the token or the database; an
admin's local job still runs, without the server's secrets in its supervisor's
environment, and what it writes for tracking lands in its run dir, private."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.serverlib import TOKEN, LiveServer, follow_events, live_server, wait_status

SSH_HOST = "10.9.9.9"  # never health-checked: a user's job for it waits, nothing starts
MLFLOW_ALLOWED = "http://mlflow.internal:5000"


@dataclass
class Team:
    server: LiveServer
    admin: httpx.Client
    mallory: httpx.Client  # a user
    vic: httpx.Client  # a viewer
    local_id: str
    ssh_id: str
    allowed: Path

    def close(self) -> None:
        for client in (self.admin, self.mallory, self.vic):
            client.close()


def _client(server: LiveServer, token: str) -> httpx.Client:
    return httpx.Client(
        base_url=server.url, timeout=60, headers={"Authorization": f"Bearer {token}"}
    )


@pytest.fixture(scope="module")
def team(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Team]:
    root = tmp_path_factory.mktemp("trust")
    allowed = root / "allowed"
    allowed.mkdir()
    srv = root / "srv"  # the server's data dir: its token, its database, its cwd
    args = ["--tracking-allow", str(allowed), "--tracking-allow", MLFLOW_ALLOWED]
    with live_server(srv, args=args, env={"CORRAL_DB": f"sqlite:///{srv / 'corral.db'}"}) as s:
        admin = s.client()
        local = admin.post("/api/network/machines", json={"name": "here", "local": True})
        ssh = admin.post("/api/network/machines", json={"name": "gpu1", "host": SSH_HOST})
        assert local.status_code == ssh.status_code == 201, (local.text, ssh.text)
        tokens = {}
        for name, role in (("mallory", "user"), ("vic", "viewer")):
            made = admin.post("/api/users", json={"name": name, "role": role})
            assert made.status_code == 201, made.text
            tokens[name] = made.json()["token"]
        team = Team(
            s,
            admin,
            _client(s, tokens["mallory"]),
            _client(s, tokens["vic"]),
            local.json()["id"],
            ssh.json()["id"],
            allowed,
        )
        try:
            yield team
        finally:
            team.close()


def _refused(answer: httpx.Response, *words: str) -> dict[str, Any]:
    assert answer.status_code == 403, answer.text
    error = dict(answer.json()["error"])
    for word in words:
        assert word in error["message"], error
    assert TOKEN not in answer.text
    return error


def _server_host(answer: httpx.Response) -> None:
    error = _refused(answer, "server's own host", "only an admin")
    assert error["details"]["rule"] == "server-host"


def test_a_user_runs_nothing_on_the_servers_host(team: Team) -> None:
    token_file = team.server.token_file
    steal = f"cat {token_file} {team.server.root / 'corral.db'}"
    script = team.server.root / "steal.py"
    script.write_text(f"print(open({str(token_file)!r}).read())\n")
    launches: list[dict[str, Any]] = [
        {"launcher": "command", "command_template": steal},
        {"launcher": "python", "script": str(script)},
        {"launcher": "torchrun", "script": str(script)},
    ]
    for launch in launches:
        body = {**launch, "preflight": False}
        on_local = {**body, "machine_selection": "manual", "selected_machines": ["here"]}
        _server_host(team.mallory.post("/api/network/execute_job", json=body))
        _server_host(team.mallory.post("/api/network/distributed/plan", json=on_local))
        _server_host(
            team.mallory.post(f"/api/network/machines/{team.local_id}/dispatch_job", json=body)
        )
        _server_host(team.mallory.post("/api/jobs/queue", json=on_local))
        task = {"name": "steal", "request": on_local}
        _server_host(team.mallory.post("/api/tasks", json=task))

    # a task made for an SSH machine, queued on the local one
    task = team.mallory.post(
        "/api/tasks", json={"name": "ok", "kind": "single", "request": launches[0]}
    )
    assert task.status_code == 201, task.text
    _server_host(team.mallory.post(f"/api/tasks/{task.json()['id']}/queue/{team.local_id}"))

    # automatic selection never picks the local machine for a user: the job waits for
    # the SSH one (it would have started at once on "here")
    queued = team.mallory.post("/api/jobs/queue", json={**launches[0], "preflight": False})
    assert queued.status_code == 201, queued.text
    assert queued.json()["reason"].startswith("waiting for 1 machine: gpu1 never health-checked")
    assert "here" not in queued.json()["reason"]
    status = team.mallory.get(f"/api/jobs/{queued.json()['job_id']}").json()
    assert status["status"] == "queued" and status["machines"] == []
    # and the new-job page's machine picker says why the local machine is not offered
    ranked = team.mallory.get("/api/tasks/distributed/suggest_machines").json()
    here = next(s for s in ranked if s["name"] == "here")
    assert (here["eligible"], here["reasons"]) == (False, ["on the server's own host: admins only"])
    assert "admins only" not in json.dumps(
        team.admin.get("/api/tasks/distributed/suggest_machines").json()
    )

    # the server's own files never leave it through a user's request
    prepare = {"machine_ids": [team.ssh_id], "source": str(team.server.root)}
    _server_host(team.mallory.post("/api/network/prepare_dependencies", json=prepare))
    sync = {
        **launches[0],
        "sync": True,
        "code_dir": str(team.server.root),
        "machine_selection": "manual",
        "selected_machines": ["gpu1"],
    }
    _server_host(team.mallory.post("/api/jobs/queue", json=sync))
    _server_host(team.mallory.post("/api/jobs/queue", json={**sync, "sync": False}))
    del sync["sync"], sync["code_dir"]
    for path in (token_file, team.server.root / "corral.db", team.server.run_dir / ".." / "token"):
        _server_host(team.mallory.post("/api/jobs/queue", json={**sync, "calibration": str(path)}))

    # the admin may: the same request is no 403 for them
    here = team.admin.post(
        "/api/network/execute_job", json={"launcher": "command", "command_template": "true"}
    )
    assert here.status_code == 200, here.text
    wait_status(team.admin, here.json()["job_id"], ["succeeded"])


@pytest.mark.parametrize(
    "target",
    [
        "mlflow:sqlite:////tmp/x/owned.db",
        "mlflow:file:///tmp/x/mlruns",
        "mlflow:/tmp/x/mlruns",
        "tensorboard:/any/dir",
        "tensorboard:../../escaped",
        "tensorboard:~/tb",
        "mlflow:http://169.254.169.254/",
        "mlflow:http://[fe80::1]:5000/",
        "mlflow:http://metadata.google.internal/",
        "mlflow:https://mlflow.example.com",
        "mlflow:postgresql://db.internal/mlflow",
    ],
)
def test_a_users_tracking_target_out_of_bounds_is_refused(team: Team, target: str) -> None:
    body = {"launcher": "command", "command_template": "true", "track": [target]}
    for answer in (
        team.mallory.post("/api/jobs/queue", json=body),
        team.mallory.post(
            "/api/network/distributed/plan",
            json={**body, "machine_selection": "manual", "selected_machines": ["gpu1"]},
        ),
    ):
        error = _refused(answer, repr(target))
        assert error["details"] == {
            "field": "track",
            "target": target,
            "rule": "link-local"
            if "169.254" in target or "fe80" in target or "metadata" in target
            else "tracking-allow-list",
        }


def test_tracking_in_bounds_is_accepted_and_metadata_is_refused_to_admins_too(team: Team) -> None:
    for target in (
        "tensorboard:tb",
        "mlflow:sqlite:///mlflow.db",
        "mlflow:file:./mlruns",
        f"tensorboard:{team.allowed / 'tb'}",
        f"mlflow:sqlite:///{team.allowed / 'm.db'}",
        f"{'mlflow:' + MLFLOW_ALLOWED}/",
        "wandb:proj",
    ):
        body = {"launcher": "command", "command_template": "true", "track": [target]}
        answer = team.mallory.post("/api/jobs/queue", json=body)
        assert answer.status_code == 201, (target, answer.text)
    metadata = {
        "launcher": "command",
        "command_template": "true",
        "track": ["mlflow:http://169.254.169.254/latest/"],
    }
    _refused(team.admin.post("/api/network/execute_job", json=metadata), "metadata")


def test_an_admins_local_job_lacks_the_servers_secrets_and_others_cannot_read_it(
    team: Team,
) -> None:
    # the rank walks up to its supervisor and reads its environment; prints its umask;
    # the markers are computed by the shell, so the job's name (its template) lacks them
    template = (
        'echo MARK-OUTPUT-$((6 * 7)); umask; p=$PPID; while [ "$p" -gt 1 ]; do '
        "if tr '\\0' ' ' < /proc/$p/cmdline | grep -q corral.service.launch; then "
        "if tr '\\0' '\\n' < /proc/$p/environ | grep -Eq '^CORRAL_(DB|TOKEN|TOKEN_FILE)='; "
        "then echo SUPERVISOR-HAS-SECRETS; else echo SUPERVISOR-CLEAN; fi; fi; "
        "p=$(cut -d' ' -f4 /proc/$p/stat); done; echo MARK-ERROR-$((6 * 7)) >&2; exit 3"
    )
    answer = team.admin.post(
        "/api/network/execute_job",
        json={
            "launcher": "command",
            "command_template": template,
            "preflight": False,
            "track": ["tensorboard:tb"],
        },
    )
    assert answer.status_code == 200, answer.text
    job_id = answer.json()["job_id"]
    done = wait_status(team.admin, job_id, ["succeeded", "failed"])
    assert done["status"] == "failed" and done["exit_code"] == 3, done
    assert "MARK-ERROR-42" in json.dumps(done["root_cause"])  # the owner's view
    lines = team.admin.get(f"/api/network/local_job_output/{job_id}").json()["lines"]
    text = "\n".join(lines)
    assert "MARK-OUTPUT-42" in text
    assert "SUPERVISOR-CLEAN" in text and "SUPERVISOR-HAS-SECRETS" not in text, text
    assert "0077" in text, text

    # the relative tracking dir is in the job's run dir, private to the server's user
    job_dir = team.server.run_dir / job_id
    events = list((job_dir / "tb" / job_id).glob("events.out.tfevents.*"))
    assert events, sorted(str(p) for p in job_dir.rglob("*"))
    assert not (team.server.root / "tb").exists()
    assert stat.S_IMODE(events[0].stat().st_mode) == 0o600
    assert stat.S_IMODE((job_dir / "tb" / job_id).stat().st_mode) == 0o700

    # the output is its owner's and the admins': neither a user nor a viewer reads it
    for other in (team.mallory, team.vic):
        _refused(other.get(f"/api/network/local_job_output/{job_id}"), "owner")
        _refused(other.get(f"/api/network/local_job_file/{job_id}/events"), "owner")
        _refused(other.get(f"/api/jobs/{job_id}/files"), "owner")
        # the state is everyone's; the lines of output the root cause quotes are not
        for path in (f"/api/jobs/{job_id}", f"/api/network/distributed/status/{job_id}"):
            shown = other.get(path)
            assert shown.json()["status"] == "failed", shown.text
            assert shown.json()["root_cause"]["message"]
            assert "MARK-ERROR-42" not in shown.text
        seen = follow_events(other, job_id)
        kinds = {kind for _, kind, _ in seen}
        assert "finished" in kinds and "log" not in kinds, kinds
        assert "shown to its owner (admin) and admins only" in seen[0][2]
        assert "MARK-OUTPUT-42" not in json.dumps(seen)
    # the CLI says so too: `corral job logs` is refused, `-f` follows without the lines
    env = {**os.environ, "CORRAL_TOKEN": team.mallory.headers["Authorization"][7:]}
    cli = [sys.executable, "-m", "corral", "job", "logs", job_id, "--server", team.server.url]
    refused = subprocess.run(cli, capture_output=True, text=True, env=env, timeout=120)
    assert refused.returncode != 0 and "owner (admin) and admins only" in refused.stderr
    followed = subprocess.run([*cli, "-f"], capture_output=True, text=True, env=env, timeout=120)
    assert "shown to its owner (admin) and admins only" in followed.stdout + followed.stderr
    assert "MARK-OUTPUT-42" not in followed.stdout + followed.stderr
    mine = follow_events(team.admin, job_id)
    assert "MARK-OUTPUT-42" in json.dumps(mine)
