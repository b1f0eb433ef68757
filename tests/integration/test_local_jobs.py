"""Real jobs on the embedded local cluster: processes, signals, logs, teardown."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from .conftest import (
    SCRIPTS,
    corral_argv,
    job_processes,
    run_corral,
    wait_for_output,
    wait_no_job_processes,
)

LAUNCHERS = ["python", "torchrun"]


def _common(run_dir: Path, job_id: str, hosts: str = "local:2", nproc: int = 2) -> list[str]:
    return [
        "run",
        "--hosts",
        hosts,
        "--nproc-per-node",
        str(nproc),
        "--master-port",
        "0",
        "--run-dir",
        str(run_dir),
        "--job-id",
        job_id,
        "--grace",
        "5",
    ]


def _world(launcher: str) -> tuple[str, int]:
    """Hosts and ranks per node for a test of what each node does on its own (name a
    rank's failure, clean up when corral is gone): 2 nodes x 2 for the python launcher;
    1 node x 4 for torchrun (each node's torchrun imports torch, ~2 CPU-s; torchrun
    across nodes: the failing-rank teardown, SIGINT and verbatim-job tests)."""
    return ("local:2", 2) if launcher == "python" else ("local:1", 4)


def _start(args: list[str], cwd: Path) -> subprocess.Popen[str]:
    return subprocess.Popen(
        corral_argv(*args),
        cwd=cwd,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=dict(os.environ, COLUMNS="200"),
    )


@pytest.mark.parametrize("launcher", LAUNCHERS)
def test_failing_rank_tears_down_every_process(
    launcher: str, run_dir: Path, tmp_path: Path
) -> None:
    job = f"exit7-{launcher}"
    started = time.monotonic()
    result = run_corral(
        *_common(run_dir, job),
        "--launcher",
        launcher,
        "--",
        str(SCRIPTS / "steps.py"),
        "--fail-rank",
        "1",
        "--fail-at",
        "5",
        cwd=tmp_path,
    )
    assert result.returncode == 7, result.stderr[-3000:]
    assert not wait_no_job_processes(job, within=10)
    assert time.monotonic() - started < 120
    assert re.search(r"root cause: rank 1 on local-\d exited with code 7", result.stderr)
    assert "rank 1 is about to fail (exit)" in result.stderr  # stderr tail in the report
    # every rank ran, and every line carries its host and rank
    for rank in range(4):
        assert re.search(rf"^\[local-\d:{rank}\] rank {rank} step 0$", result.stdout, re.M)


def test_a_rank_killed_by_a_signal_is_the_cause_not_the_peer_that_noticed(
    run_dir: Path, tmp_path: Path
) -> None:
    # rank 1 (local-1) SIGKILLs itself; rank 0 (local-0) sees its peer vanish and exits 1
    # first in the reports; the root cause is what happened (issue 33 item 7)
    job = "peer-dies"
    result = run_corral(
        *_common(run_dir, job, nproc=1),
        "--launcher",
        "python",
        "--",
        str(SCRIPTS / "peer_dies.py"),
        cwd=tmp_path,
    )
    assert result.returncode == 128 + 9, result.stderr[-3000:]
    assert "[local-0:0] RuntimeError: Connection closed by peer" in result.stdout
    assert re.search(r"^root cause: rank 1 on local-1 killed by SIGKILL$", result.stderr, re.M)
    assert not wait_no_job_processes(job, within=10)


@pytest.mark.parametrize("launcher", LAUNCHERS)
def test_sigkilled_rank_is_named_with_its_signal(
    launcher: str, run_dir: Path, tmp_path: Path
) -> None:
    job = f"kill-{launcher}"
    result = run_corral(
        *_common(run_dir, job, *_world(launcher)),
        "--launcher",
        launcher,
        "--",
        str(SCRIPTS / "steps.py"),
        "--fail-rank",
        "2",
        "--mode",
        "kill",
        cwd=tmp_path,
    )
    assert result.returncode == 128 + 9, result.stderr[-3000:]
    assert not wait_no_job_processes(job, within=10)
    assert re.search(r"root cause: rank 2 on local-\d killed by SIGKILL", result.stderr)
    assert "OOM" in result.stderr


@pytest.mark.parametrize("launcher", LAUNCHERS)
def test_exception_traceback_of_the_right_rank(
    launcher: str, run_dir: Path, tmp_path: Path
) -> None:
    job = f"raise-{launcher}"
    result = run_corral(
        *_common(run_dir, job, *_world(launcher)),
        "--launcher",
        launcher,
        "--",
        str(SCRIPTS / "steps.py"),
        "--fail-rank",
        "3",
        "--mode",
        "raise",
        cwd=tmp_path,
    )
    assert result.returncode == 1, result.stderr[-3000:]
    report = result.stderr[result.stderr.index("root cause:") :]
    assert re.search(r"root cause: rank 3 on local-\d exited with code 1", report)
    assert "traceback (from the rank's error file)" in report
    assert "ValueError: bad batch on rank 3" in report
    assert "steps.py" in report and "runpy" not in report
    errors = list(run_dir.glob(f"{job}/nodes/*/errors/attempt-0-rank-3.json"))
    assert len(errors) == 1 and json.loads(errors[0].read_text())["exc_type"] == "ValueError"


@pytest.mark.parametrize("launcher", LAUNCHERS)
def test_sigint_to_corral_tears_down_once(launcher: str, run_dir: Path, tmp_path: Path) -> None:
    job = f"sigint-{launcher}"
    proc = _start(
        [*_common(run_dir, job), "--launcher", launcher, "--", str(SCRIPTS / "steps.py")], tmp_path
    )
    try:
        wait_for_output(proc, r"rank \d step 3")
        assert len(job_processes(job)) >= 4
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert proc.returncode == 130, err[-3000:]
    assert err.count("interrupted: stopping every node") == 1
    assert "cancelled" in err
    # nodes corral stopped read as stopped, not failed; the launcher's own teardown
    # traceback is folded into one line per node (and kept in the node's log)
    rows = [line for line in err.splitlines() if re.match(r"\W*local-\d ", line)]
    assert len(rows) == 2 and all("stopped" in row and "failed" not in row for row in rows), err
    assert "SignalException" not in out and "Traceback" not in out, out[-3000:]
    assert not wait_no_job_processes(job, within=10)


def test_second_sigint_kills_at_once(run_dir: Path, tmp_path: Path) -> None:
    job = "sigint-twice"
    trap = tmp_path / "trap.py"
    trap.write_text(
        "import signal, time, os\n"
        "signal.signal(signal.SIGTERM, lambda *_: print('got SIGTERM', flush=True))\n"
        "print('ready', flush=True)\n"
        "while True:\n"
        "    time.sleep(600)\n"
    )
    proc = _start(
        [
            *_common(run_dir, job, nproc=1),
            "--launcher",
            "python",
            "--grace",
            "300",
            "--",
            str(trap),
        ],
        tmp_path,
    )
    try:
        wait_for_output(proc, r"ready(.|\n)*ready")
        proc.send_signal(signal.SIGINT)
        wait_for_output(proc, r"got SIGTERM")  # corral's teardown reached the rank
        assert proc.poll() is None  # still in its 300 s grace: the ranks ignore SIGTERM
        started = time.monotonic()
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=60)
        assert time.monotonic() - started < 30  # the bound is the behaviour: killed now
    finally:
        proc.kill()
    assert proc.returncode == 130
    assert "killing every node now" in err
    assert not wait_no_job_processes(job, within=10)


@pytest.mark.parametrize("launcher", LAUNCHERS)
def test_sigkilled_corral_leaves_nothing_behind(
    launcher: str, run_dir: Path, tmp_path: Path
) -> None:
    job = f"corral-killed-{launcher}"
    common = _common(run_dir, job, *_world(launcher))
    proc = _start([*common, "--launcher", launcher, "--", str(SCRIPTS / "steps.py")], tmp_path)
    try:
        wait_for_output(proc, r"rank \d step 3")
        proc.kill()  # no teardown by corral itself: the agents notice their stdin closing
        proc.wait(timeout=10)
    finally:
        proc.kill()
    assert not wait_no_job_processes(job, within=30)


def test_detached_child_of_a_rank_is_cleaned_up(run_dir: Path, tmp_path: Path) -> None:
    job = "daemon"
    result = run_corral(
        *_common(run_dir, job),
        "--launcher",
        "python",
        "--",
        str(SCRIPTS / "steps.py"),
        "--steps",
        "3",
        "--daemon",
        cwd=tmp_path,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert not wait_no_job_processes(job, within=10)


def test_timeout_stops_the_job(run_dir: Path, tmp_path: Path) -> None:
    job = "timeout"
    result = run_corral(
        *_common(run_dir, job),
        "--launcher",
        "python",
        "--timeout",
        "3",
        "--",
        str(SCRIPTS / "steps.py"),
        cwd=tmp_path,
    )
    assert result.returncode == 124, result.stderr[-3000:]
    assert "timed out after 3 s" in result.stderr
    assert not wait_no_job_processes(job, within=10)


# one job per launcher shows both (each torchrun per node imports torch, ~2 CPU-s):
# every rank writes its argv and env, then prints LINES numbered lines
LINES = 10_000
TRICKY = [
    "a b",
    "it's",
    'say "hi"',
    "$(touch /tmp/corral-pwned)",
    "x; rm -rf /",
    "$HOME",
    "naïve ☃ 日本",
    "line1\nline2",
    "",
    "*",
    "--flag=1",
]


@dataclass
class VerbatimJob:
    job: str
    run_dir: Path
    out_dir: Path
    result: subprocess.CompletedProcess[str]


@pytest.fixture(scope="module", params=LAUNCHERS)
def verbatim_job(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[VerbatimJob]:
    """A job of 2 nodes x 2 ranks running scripts/verbatim.py with tricky arguments."""
    launcher = request.param
    tmp = tmp_path_factory.mktemp(f"verbatim-{launcher}")
    run_dir, out_dir = tmp / "runs", tmp / "out"
    out_dir.mkdir()
    job = f"verbatim-{launcher}"
    result = run_corral(
        *_common(run_dir, job),
        "--launcher",
        launcher,
        "--env",
        f"OUT_DIR={out_dir}",
        "--env",
        "WEIRD=a b;$(x)",
        "--env",
        f"LINES_PER_RANK={LINES}",
        "--",
        str(SCRIPTS / "verbatim.py"),
        *TRICKY,
        cwd=tmp,
    )
    yield VerbatimJob(job, run_dir, out_dir, result)
    for proc in job_processes(job):
        proc.kill()


def test_every_line_exactly_once_and_unbroken(verbatim_job: VerbatimJob) -> None:
    # 10,000 lines of 60 bytes per rank: each pipe (64 KiB) fills and drains ~10 times,
    # lines cross read boundaries, four ranks interleave; more only costs CPU
    result, run_dir, job = verbatim_job.result, verbatim_job.run_dir, verbatim_job.job
    assert result.returncode == 0, result.stderr[-3000:]
    pattern = re.compile(r"^\[(local-\d):(\d)\] rank (\d) line (\d+) x{40}$")
    seen: dict[int, list[int]] = {r: [] for r in range(4)}
    hosts: dict[int, str] = {}
    for line in result.stdout.splitlines():
        m = pattern.match(line)
        if m is None:
            assert not line.startswith("[local-0:") and not line.startswith("[local-1:"), line
            continue
        prefix_rank, rank = int(m.group(2)), int(m.group(3))
        assert prefix_rank == rank, line
        hosts[rank] = m.group(1)
        seen[rank].append(int(m.group(4)))
    for rank in range(4):
        assert seen[rank] == list(range(LINES)), f"rank {rank}: {len(seen[rank])} lines"
        log = run_dir / job / "logs" / f"{hosts[rank]}.{rank}.log"
        lines = log.read_text().splitlines()
        assert lines == [f"rank {rank} line {i} " + "x" * 40 for i in range(LINES)]
        node_logs = list(run_dir.glob(f"{job}/nodes/{hosts[rank]}/logs/rank-{rank}.log"))
        assert len(node_logs) == 1 and node_logs[0].read_text().splitlines() == lines


def test_arguments_and_env_arrive_verbatim(verbatim_job: VerbatimJob) -> None:
    result = verbatim_job.result
    assert result.returncode == 0, result.stderr[-3000:]
    assert not Path("/tmp/corral-pwned").exists()
    for rank in range(4):
        data = json.loads((verbatim_job.out_dir / f"rank-{rank}.json").read_text())
        assert data["argv"] == TRICKY
        env = data["env"]
        assert env["WEIRD"] == "a b;$(x)"
        assert env["RANK"] == str(rank) and env["WORLD_SIZE"] == "4"
        assert env["LOCAL_WORLD_SIZE"] == "2" and env["NNODES"] == "2"
        assert env["CORRAL_JOB_ID"] == verbatim_job.job
        assert "PYTEST_CURRENT_TEST" not in env  # the coordinator's env is not forwarded


def test_node_working_directories_are_separate(run_dir: Path, tmp_path: Path) -> None:
    script = tmp_path / "cwd.py"
    script.write_text(
        "import os\nopen('mine.txt', 'w').write(os.environ['RANK'])\nprint(os.getcwd())\n"
    )
    result = run_corral(
        *_common(run_dir, "cwd", nproc=1), "--launcher", "python", "--", str(script), cwd=tmp_path
    )
    assert result.returncode == 0, result.stderr[-3000:]
    for node in range(2):
        work = run_dir / "cwd" / "nodes" / f"local-{node}" / "work"
        assert (work / "mine.txt").read_text() == str(node)
        assert f"[local-{node}:{node}] {work}" in result.stdout


def test_a_reader_that_stops_reading_does_not_kill_the_job(run_dir: Path, tmp_path: Path) -> None:
    """Output waits for a paused reader (`| less`, Ctrl-S); heartbeats do not."""
    script = tmp_path / "chatty.py"
    script.write_text(
        "import os, sys, time\n"
        "r = os.environ['RANK']\n"
        "for i in range(100):\n"
        "    sys.stdout.write(''.join(f'rank {r} tick {i} line {j} ' + 'y' * 900 + '\\n'\n"
        "                             for j in range(10)))\n"
        "    sys.stdout.flush()\n"
        "    time.sleep(0.1)\n"
    )
    with open(tmp_path / "err.txt", "w") as err:
        proc = subprocess.Popen(
            corral_argv(
                *_common(run_dir, "paused-reader"),
                "--launcher",
                "python",
                "--host-timeout",
                "5",  # the agents' heartbeat deadline
                "--",
                str(script),
            ),
            cwd=tmp_path,
            stdout=subprocess.PIPE,
            stderr=err,
        )
        try:
            time.sleep(9)  # longer than the agents' 5 s heartbeat deadline; pipe is full
            out, _ = proc.communicate(timeout=120)
        finally:
            proc.kill()
    assert proc.returncode == 0, (tmp_path / "err.txt").read_text()[-3000:]
    assert out.count(b"\n") == 4 * 100 * 10
    assert "heartbeat lost" not in (tmp_path / "err.txt").read_text()
