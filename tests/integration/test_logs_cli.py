"""``corral logs``: the latest job by default, where it looked when a job is missing, and a
marker line opening each attempt's output."""

from __future__ import annotations

import json
import re
from pathlib import Path

from .conftest import run_corral

HELLO = "import os; print('hello from', os.environ['CORRAL_JOB_ID'], 'rank', os.environ['RANK'])\n"


def _run(tmp_path: Path, run_dir: Path, job_id: str, code: str = HELLO, *extra: str) -> None:
    script = tmp_path / f"{job_id}.py"
    script.write_text(code)
    result = run_corral(
        "run",
        "--hosts",
        "local:1",
        "--nproc-per-node",
        "2",
        "--launcher",
        "python",
        "--master-port",
        "0",
        "--no-preflight",
        *extra,
        "--run-dir",
        str(run_dir),
        "--job-id",
        job_id,
        "--",
        str(script),
        cwd=tmp_path,
    )
    assert result.returncode == 0, result.stderr[-3000:]


def _logs(tmp_path: Path, *args: str) -> tuple[int, str, str]:
    result = run_corral("logs", *args, cwd=tmp_path, timeout=60)
    return result.returncode, result.stdout, result.stderr


def test_no_job_id_and_latest_are_the_job_that_ran_last(run_dir: Path, tmp_path: Path) -> None:
    _run(tmp_path, run_dir, "zz-first")  # sorts after the second: "last" is by time, not name
    _run(tmp_path, run_dir, "aa-second")
    for args in ((), ("latest",)):
        code, out, err = _logs(tmp_path, *args, "--run-dir", str(run_dir))
        assert code == 0, err
        assert sorted(out.splitlines()) == [
            "[local-0:0] hello from aa-second rank 0",
            "[local-0:1] hello from aa-second rank 1",
        ]
    code, out, err = _logs(tmp_path, "zz-first", "--run-dir", str(run_dir))
    assert code == 0 and "hello from zz-first rank 0" in out, err


def test_missing_job_names_the_absolute_run_dir(tmp_path: Path) -> None:
    (tmp_path / "runs" / "other").mkdir(parents=True)
    (tmp_path / "runs" / "other" / "job.json").write_text("{}")
    code, out, err = _logs(tmp_path, "nope")  # the default run dir, relative to the cwd
    assert code == 2 and out == ""
    assert "Traceback" not in err
    line = " ".join(err.split())  # one message, however the terminal width wraps it
    assert f"no job 'nope' in {tmp_path / 'runs'};" in line
    assert "latest jobs: other" in line and "--run-dir" in line


def test_no_run_dir_at_all_says_where_it_looked(tmp_path: Path) -> None:
    code, _, err = _logs(tmp_path)
    assert code == 2 and "Traceback" not in err
    line = " ".join(err.split())
    assert f"no run directory {tmp_path / 'runs'};" in line and "--run-dir" in line


def test_usage_names_the_argument_job(tmp_path: Path) -> None:
    code, out, _ = _logs(tmp_path, "--help")
    assert code == 0
    assert re.search(r"Usage: .*logs \[OPTIONS\] \[JOB\]", out), out
    assert "job_id" not in out.lower()


def _restarted_job(run_dir: Path) -> None:
    """A job of two attempts, as the engine leaves it: rank 0 wrote in both, rank 1 only in
    the first; attempts.jsonl says where each attempt's output began."""
    job = run_dir / "restarted"
    logs = job / "logs"
    logs.mkdir(parents=True)
    (job / "job.json").write_text(json.dumps({"job_id": "restarted", "hosts": []}))
    (job / "attempts.json").write_text(
        json.dumps(
            [
                {"number": 0, "hosts": ["local-0"], "world_size": 2, "started": 1.0e9},
                {"number": 1, "hosts": ["local-0"], "world_size": 2, "started": 1.0e9 + 60},
            ]
        )
    )
    first, second = b"a0 line 1\na0 line 2\n", b"a1 line 1\n"
    (logs / "local-0.0.log").write_bytes(first + second)
    (logs / "local-0.1.log").write_bytes(b"r1 a0\n")
    index = [
        {"attempt": 0, "file": "local-0.0.log", "offset": 0},
        {"attempt": 0, "file": "local-0.1.log", "offset": 0},
        {"attempt": 1, "file": "local-0.0.log", "offset": len(first)},
    ]
    (logs / "attempts.jsonl").write_text("".join(json.dumps(i) + "\n" for i in index))


def test_a_marker_line_opens_each_attempt(tmp_path: Path) -> None:
    run_dir = tmp_path / "runs"
    _restarted_job(run_dir)
    code, out, err = _logs(tmp_path, "restarted", "--run-dir", str(run_dir))
    assert code == 0, err
    marker = r"\[corral\] ---- attempt {}, started \d{{4}}-\d\d-\d\d \d\d:\d\d:\d\d ----"
    lines = out.splitlines()
    assert re.fullmatch(r"\[local-0:0\] " + marker.format(0), lines[0]), lines
    assert lines[1:3] == ["[local-0:0] a0 line 1", "[local-0:0] a0 line 2"]
    assert re.fullmatch(r"\[local-0:0\] " + marker.format(1), lines[3]), lines
    assert lines[4] == "[local-0:0] a1 line 1"
    assert re.fullmatch(r"\[local-0:1\] " + marker.format(0), lines[5]), lines
    assert lines[6:] == ["[local-0:1] r1 a0"]


def test_one_attempt_has_no_markers(run_dir: Path, tmp_path: Path) -> None:
    _run(tmp_path, run_dir, "once")
    code, out, err = _logs(tmp_path, "once", "--run-dir", str(run_dir))
    assert code == 0, err
    assert "[corral] ----" not in out and len(out.splitlines()) == 2


def test_attempts_without_an_index_are_said_to_be_mixed(tmp_path: Path) -> None:
    run_dir = tmp_path / "runs"
    _restarted_job(run_dir)
    (run_dir / "restarted" / "logs" / "attempts.jsonl").unlink()  # an older corral's logs
    code, out, err = _logs(tmp_path, "restarted", "--run-dir", str(run_dir))
    assert code == 0, err
    assert "job restarted ran 2 attempts; its logs do not record where each began" in err
    assert out.splitlines()[:2] == [
        "[local-0:0] [corral] ---- earlier attempt(s), not told apart ----",
        "[local-0:0] a0 line 1",
    ]


FLAKY = (
    "import os, sys\n"
    "attempt, rank = os.environ['CORRAL_ATTEMPT'], os.environ['RANK']\n"
    "print('attempt', attempt, 'rank', rank, flush=True)\n"
    "sys.exit(1 if (attempt, rank) == ('0', '1') else 0)\n"
)


def test_a_restarted_jobs_logs_mark_each_attempt(run_dir: Path, tmp_path: Path) -> None:
    _run(tmp_path, run_dir, "flaky", FLAKY, "--max-restarts", "1", "--restart-backoff", "0")
    code, out, err = _logs(tmp_path, "flaky", "--rank", "1", "--run-dir", str(run_dir))
    assert code == 0, err
    lines = [line for line in out.splitlines() if line.startswith("[local-0:1]")]
    assert re.match(r"\[local-0:1\] \[corral\] ---- attempt 0, started .* ----$", lines[0]), lines
    assert lines[1] == "[local-0:1] attempt 0 rank 1"
    assert re.match(r"\[local-0:1\] \[corral\] ---- attempt 1, started .* ----$", lines[2]), lines
    assert lines[3] == "[local-0:1] attempt 1 rank 1"
    assert len(lines) == 4
