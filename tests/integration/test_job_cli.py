"""``corral job``: the CLI client of a real ``corral serve`` (a subprocess on a free port)
with one local machine, ``sim1`` (2 slots)."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from corral.client import Client, parse_sse
from corral.client.jobs import exit_code_of
from tests.conftest import require
from tests.unit.test_service_planner import calibration_file

from .conftest import SCRIPTS, corral_argv, job_processes, wait_for_output

STEPS = str(SCRIPTS / "steps.py")
OK = ("--", STEPS, "--steps", "3")
FAIL = ("--", STEPS, "--steps", "50", "--fail-rank", "1", "--fail-at", "2", "--code", "3")
Submitted = tuple[str, "subprocess.CompletedProcess[str]"]
"""A job id and the ``corral job submit -f`` run that made it."""
LOCAL = ("--launcher", "python", "--nproc-per-node", "2", "--no-preflight")


@dataclass
class Server:
    url: str
    token: str
    run_dir: Path
    home: Path

    def env(self, **extra: str) -> dict[str, str]:
        """The environment of a ``corral job`` run against this server."""
        env = {
            k: v for k, v in os.environ.items() if not k.startswith("CORRAL_") or k == "CORRAL_CI"
        }
        env.update(
            COLUMNS="200",
            XDG_DATA_HOME=str(self.home),  # no default token file of the user's
            CORRAL_SERVER=self.url,
            CORRAL_TOKEN=self.token,
        )
        env.update(extra)
        return env

    def job(self, *args: str, timeout: float = 120, **env: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            corral_argv("job", *args),
            capture_output=True,
            text=True,
            timeout=timeout,
            env=self.env(**env),
            cwd=self.home,
        )


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@contextmanager
def serving(base: Path, port: int | None = None) -> Iterator[Server]:
    """``corral serve`` on ``port`` (default: a free one) over a store, token and run dir
    in ``base`` (kept across calls: a second call is the same server restarted)."""
    base.mkdir(parents=True, exist_ok=True)
    token_file = base / "token"
    if not token_file.exists():
        token_file.write_text("test-token-" + os.urandom(32).hex() + "\n")
        token_file.chmod(0o600)
    token = token_file.read_text().strip()
    port = port or _free_port()
    run_dir = base / "runs"
    url = f"http://127.0.0.1:{port}"
    with open(base / "serve.log", "ab") as log:
        proc = subprocess.Popen(
            corral_argv(
                "serve",
                "--port",
                str(port),
                "--db",
                f"sqlite:///{base / 'corral.db'}",
                "--token-file",
                str(token_file),
                "--run-dir",
                str(run_dir),
            ),
            stdout=log,
            stderr=subprocess.STDOUT,
            env={k: v for k, v in os.environ.items() if k != "CORRAL_TOKEN"},
        )
        try:
            deadline = time.monotonic() + 60
            while True:
                try:
                    if httpx.get(f"{url}/healthz", timeout=2).status_code == 200:
                        break
                except httpx.HTTPError:
                    pass
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise AssertionError((base / "serve.log").read_text())
                time.sleep(0.2)
            yield Server(url, token, run_dir, base)
        finally:
            proc.terminate()
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def _kill_jobs(run_dir: Path) -> None:
    for job in run_dir.glob("*") if run_dir.exists() else []:
        for child in job_processes(job.name):
            child.kill()


def _add_sim1(server: Server) -> None:
    answer = httpx.post(
        f"{server.url}/api/network/machines",
        json={"name": "sim1", "local": True, "slots": 2},
        headers={"Authorization": f"Bearer {server.token}"},
        timeout=30,
    )
    assert answer.status_code == 201, answer.text


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    base = tmp_path_factory.mktemp("serve")
    try:
        with serving(base) as running:
            _add_sim1(running)
            yield running
    finally:
        _kill_jobs(base / "runs")


@pytest.fixture(scope="module")
def ok_job(server: Server) -> Submitted:
    result = server.job("submit", *LOCAL, "--name", "ok", "-f", *OK)
    return result.stdout.splitlines()[0], result


@pytest.fixture(scope="module")
def failed_job(server: Server) -> Submitted:
    result = server.job("submit", *LOCAL, "--name", "bad", "-f", *FAIL)
    return result.stdout.splitlines()[0], result


def test_submit_follow_prints_every_rank_and_exits_0(
    ok_job: Submitted,
) -> None:
    job_id, result = ok_job
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert job_id and " " not in job_id
    assert "[sim1:0] rank 0 step 2" in lines and "[sim1:1] rank 1 step 2" in lines
    assert f"job {job_id}: sim1; 2 ranks" in result.stderr  # machines and master on stderr
    assert "master sim1" in result.stderr
    assert "succeeded, exit code 0" in result.stderr
    assert "Traceback" not in result.stderr


def test_submit_without_follow_prints_only_the_job_id(server: Server) -> None:
    result = server.job("submit", *LOCAL, *OK)
    assert result.returncode == 0, result.stderr
    assert len(result.stdout.splitlines()) == 1
    job_id = result.stdout.strip()
    followed = server.job("logs", job_id, "-f")
    assert followed.returncode == 0, followed.stderr
    assert "[sim1:1] rank 1 step 2" in followed.stdout.splitlines()


def test_failed_job_exits_with_the_rank_code_and_shows_the_root_cause(
    server: Server, failed_job: Submitted
) -> None:
    job_id, result = failed_job
    assert result.returncode == 3, result.stderr
    assert "[sim1:1] rank 1 step 2" in result.stdout.splitlines()
    assert "root cause: rank 1 on sim1 exited with code 3" in result.stderr
    status = server.job("status", job_id)
    assert status.returncode == 3, status.stderr
    assert "failed" in status.stdout
    assert "root cause: rank 1 on sim1 exited with code 3" in status.stdout
    assert "host: sim1   rank: 1   exit: 3" in status.stdout
    assert "rank 1 is about to fail (exit)" in status.stdout  # its stderr tail
    data = json.loads(server.job("status", job_id, "--json").stdout)
    assert data["status"] == "failed" and data["root_cause"]["rank"] == 1


def test_status_of_a_succeeded_job(server: Server, ok_job: Submitted) -> None:
    job_id, _ = ok_job
    result = server.job("status", job_id)
    assert result.returncode == 0, result.stderr
    assert f"job {job_id} (ok): succeeded" in result.stdout
    assert "master sim1, world size 2, machines sim1" in result.stdout
    assert "exit code 0" in result.stdout


def test_logs_pages_the_merged_output_and_filters(server: Server, ok_job: Submitted) -> None:
    job_id, _ = ok_job
    result = server.job("logs", job_id)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    for rank in (0, 1):
        assert [x for x in lines if x.startswith(f"[sim1:{rank}]")] == [
            f"[sim1:{rank}] rank {rank} step {s}" for s in range(3)
        ]
    only = server.job("logs", job_id, "--rank", "1").stdout.splitlines()
    assert only == [f"[sim1:1] rank 1 step {s}" for s in range(3)]
    assert server.job("logs", job_id, "--host", "nope").stdout == ""
    followed = server.job("logs", job_id, "-f", "--rank", "0")
    assert followed.returncode == 0
    assert followed.stdout.splitlines() == [f"[sim1:0] rank 0 step {s}" for s in range(3)]


def test_list_shows_both_jobs(
    server: Server,
    ok_job: Submitted,
    failed_job: Submitted,
) -> None:
    result = server.job("list")
    assert result.returncode == 0, result.stderr
    rows = {line.split("│")[1].strip(): line for line in result.stdout.splitlines() if "│" in line}
    assert "succeeded" in rows[ok_job[0]] and "failed" in rows[failed_job[0]]
    data = json.loads(server.job("list", "--status", "failed", "--json").stdout)
    assert failed_job[0] in [j["job_id"] for j in data["jobs"]]
    assert ok_job[0] not in [j["job_id"] for j in data["jobs"]]


def test_stop_on_a_finished_job_is_idempotent(server: Server, ok_job: Submitted) -> None:
    for _ in range(2):
        result = server.job("stop", ok_job[0])
        assert result.returncode == 0, result.stderr
        assert result.stdout.strip() == f"job {ok_job[0]} already succeeded"


def test_stop_a_running_job(server: Server) -> None:
    submitted = server.job("submit", *LOCAL, "--", STEPS, "--steps", "10000")
    job_id = submitted.stdout.strip()
    assert submitted.returncode == 0, submitted.stderr
    stopped = server.job("stop", job_id)
    assert stopped.returncode == 0 and "stopping" in stopped.stdout, stopped.stderr
    followed = server.job("logs", job_id, "-f")
    assert followed.returncode == 130, followed.stderr
    assert server.job("status", job_id).returncode == 130


def test_plan_only_prints_the_commands_and_starts_nothing(server: Server) -> None:
    result = server.job("submit", *LOCAL, "--plan-only", *OK)
    assert result.returncode == 0, result.stderr
    assert "node 0 rank 1:" in result.stdout
    assert "RANK=1" in result.stdout and STEPS in result.stdout
    job_id = result.stdout.split("plan for job ", 1)[1].split()[0]
    status = json.loads(server.job("status", job_id, "--json").stdout)
    assert status["status"] == "planned"
    dropped = server.job("stop", job_id)
    assert dropped.stdout.strip() == f"job {job_id} cancelled before it started"


def test_submit_with_a_calibration_prints_the_weights(server: Server) -> None:
    calibration_file(server.home / "cal.json", {"sim1": [10.0, 30.0]})
    result = server.job("submit", *LOCAL, "--calibration", "cal.json", "--plan-only", *OK)
    assert result.returncode == 0, result.stderr
    assert "workload weights (host:local rank): sim1:0 0.250, sim1:1 0.750" in result.stdout
    assert "CORRAL_WORKLOAD_WEIGHTS=0.25,0.75" in result.stdout
    job_id = result.stdout.split("plan for job ", 1)[1].split()[0]
    assert server.job("stop", job_id).returncode == 0
    calibration_file(server.home / "other.json", {"gpu7": [10.0, 30.0]})
    wrong = server.job("submit", *LOCAL, "--calibration", "other.json", *OK)
    assert wrong.returncode == 2 and wrong.stdout == ""
    assert wrong.stderr.startswith("error: calibration: host sim1 is not in the calibration")
    alone = server.job("submit", *LOCAL, "--rebalance", *OK)
    assert alone.stderr.strip() == "error: --rebalance: needs --calibration FILE"


def test_submit_a_command_template(server: Server) -> None:
    template = "echo node {node_rank} of {nnodes} on {host}; exit 4"
    args = ("--launcher", "command", "--command-template", template, "--no-preflight")
    result = server.job("submit", *args, "-f")
    assert result.returncode == 4, result.stderr
    assert "[sim1] node 0 of 1 on sim1" in result.stdout.splitlines()
    assert "launcher command" in result.stderr


def test_submit_track_writes_the_reports_to_tensorboard(server: Server) -> None:
    """``--track`` reaches the server's supervisor as ``corral run --track`` does."""
    require("tensorboard", "the [tensorboard] extra: make setup")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    tb = server.home / "tb"
    script = str(SCRIPTS / "report_steps.py")
    result = server.job("submit", *LOCAL, "--track", f"tensorboard:{tb}", "-f", "--", script)
    assert result.returncode == 0, result.stderr
    events = EventAccumulator(str(tb / result.stdout.splitlines()[0]))
    events.Reload()
    assert [(e.step, round(e.value, 4)) for e in events.Scalars("loss")] == [
        (s, round(1 / (s + 1), 4)) for s in range(5)
    ]
    assert [e.value for e in events.Scalars("exit_code")] == [0.0]


@pytest.mark.parametrize(
    ("args", "error"),
    [
        (
            ("--launcher", "command", "--", STEPS),
            "error: --launcher: --launcher command runs its --command-template on every "
            f"machine and takes no SCRIPT (got {STEPS!r} after --); put the script in the "
            "template",
        ),
        (
            ("--launcher", "command"),
            "error: --command-template: --launcher command needs --command-template 'TEMPLATE'",
        ),
        (
            ("--command-template", "echo hi", *OK),
            "error: --command-template: applies to --launcher command only",
        ),
        (
            ("--launcher", "madengine", *OK),
            "error: --launcher: unknown launcher 'madengine'; choose one of torchrun, python, "
            "accelerate, mlx, command",
        ),
        (
            ("--launcher", "command", "--command-template", "echo {rank}"),
            "error: command_template: unknown placeholder {rank}; the placeholders are "
            "{node_rank} {nnodes} {nproc_per_node} {world_size} {master_addr} {master_port} "
            "{host} {job_id} {nccl_interface} {gloo_interface} (write {{ and }} for a literal "
            "brace, e.g. ${{VAR}} for ${VAR})",
        ),
    ],
)
def test_submit_launch_mistakes_are_one_line(
    server: Server, args: tuple[str, ...], error: str
) -> None:
    result = server.job("submit", *args)
    assert result.returncode == 2, result.stderr
    assert result.stderr.strip() == error
    assert result.stdout == ""


def test_a_wrong_token_is_one_line(server: Server) -> None:
    result = server.job("list", CORRAL_TOKEN="wrong")
    assert result.returncode != 0
    assert result.stderr.strip() == (
        "error: the server refused the token (set CORRAL_TOKEN or --token-file)"
    )
    assert "wrong" not in result.stdout + result.stderr


def test_the_token_file_is_read(server: Server) -> None:
    result = server.job(
        "list", "--token-file", str(server.home / "token"), CORRAL_TOKEN="ignored-when-a-file"
    )
    assert result.returncode == 0, result.stderr
    assert server.token not in result.stdout + result.stderr


def test_server_errors_are_one_line(server: Server) -> None:
    result = server.job("status", "no-such-job")
    assert result.returncode == 2
    assert result.stderr.strip() == "error: no job 'no-such-job'"
    result = server.job("submit", "--machines", "3", *OK)
    assert result.returncode == 2
    assert result.stderr.strip() == "error: 3 machines needed, 1 available (1 registered)"


def test_a_server_that_is_down_is_one_line(server: Server) -> None:
    url = f"http://127.0.0.1:{_free_port()}"
    result = server.job("list", CORRAL_SERVER=url)
    assert result.returncode == 2
    assert result.stderr.strip() == f"error: cannot reach corral serve at {url}: Connection refused"


def test_events_resume_after_the_last_event_id(server: Server, ok_job: Submitted) -> None:
    client = Client(server.url, server.token)
    try:
        every = list(client.events(ok_job[0]))
        assert every[-1].event == "finished"
        middle = len(every) // 2
        rest = list(client.events(ok_job[0], every[middle].id))
    finally:
        client.close()
    assert rest == every[middle + 1 :]


def test_parse_sse() -> None:
    lines = [": ping", "id: 5", "event: log", "data: {", "data: }", "", "data: x", "", ""]
    events = list(parse_sse(lines))
    assert [(e.id, e.event, e.data) for e in events] == [
        ("5", "log", "{\n}"),
        ("5", "message", "x"),
    ]


@pytest.mark.parametrize(
    ("status", "code"),
    [
        ({"status": "running", "exit_code": None}, 0),
        ({"status": "succeeded", "exit_code": 0}, 0),
        ({"status": "failed", "exit_code": 3}, 3),
        ({"status": "lost", "exit_code": None}, 255),
        ({"status": "cancelled", "exit_code": None}, 130),
        ({"status": "timed_out", "exit_code": None}, 124),
    ],
)
def test_exit_codes_follow_corral_run(status: dict[str, object], code: int) -> None:
    assert exit_code_of(status) == code


def test_status_shows_the_current_weights() -> None:
    from rich.console import Console

    from corral.cli.jobview import print_status

    rows = [
        {"host": "gpu1", "node_rank": 0, "local_rank": 0, "weight": 0.6667},
        {"host": "gpu2", "node_rank": 1, "local_rank": 0, "weight": 0.3333},
    ]
    console = Console(record=True, width=200)
    print_status({"job_id": "j", "status": "running", "workload_weights": rows}, console)
    text = console.export_text()
    assert "workload weights (host:local rank): gpu1:0 0.667, gpu2:0 0.333" in text
    console = Console(record=True, width=200)
    print_status({"job_id": "j", "status": "running", "workload_weights": None}, console)
    assert "workload weights" not in console.export_text()


def test_no_module_of_the_server_is_needed() -> None:
    """The client imports neither FastAPI nor SQLAlchemy (fast start, small installs)."""
    code = (
        "import sys, corral.cli.job; "
        "print(sorted(x for x in ('fastapi', 'sqlalchemy', 'uvicorn') if x in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]", out.stdout


def test_follow_resumes_across_a_server_restart(tmp_path: Path) -> None:
    """The follower reconnects with Last-Event-ID: every line once, none lost."""
    base = tmp_path / "serve"
    port = _free_port()
    try:
        with serving(base, port) as first:
            _add_sim1(first)
            submitted = first.job("submit", *LOCAL, "--", STEPS, "--steps", "40")
            assert submitted.returncode == 0, submitted.stderr
            job_id = submitted.stdout.strip()
            follower = subprocess.Popen(
                corral_argv("job", "logs", job_id, "-f"),
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
                env=first.env(),
            )
            seen = wait_for_output(follower, r"rank 0 step 5\n", timeout=60)
        time.sleep(1.0)  # the server is down: the follower keeps trying
        with serving(base, port):
            assert follower.stdout is not None and follower.stderr is not None
            out = follower.stdout.read()  # through the buffer wait_for_output read into
            err = follower.stderr.read()
            follower.wait(timeout=30)
    finally:
        _kill_jobs(base / "runs")
    assert follower.returncode == 0, err
    lines = (seen + out).splitlines()
    for rank in (0, 1):
        mine = [x for x in lines if x.startswith(f"[sim1:{rank}]")]
        assert mine == [f"[sim1:{rank}] rank {rank} step {s}" for s in range(40)], err
