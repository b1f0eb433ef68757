"""The checklist's host side and `corral check` on local nodes (real processes)."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

from corral.agent import hostfacts as hostside
from corral.checks.gather import SHIPPED
from corral.remote.python import bootstrap_argv, program, stdin_payload

from .conftest import run_corral


def test_route_listen_connect_and_port_holders() -> None:
    route = hostside.route_to("127.0.0.1")
    assert route["interface"] == "lo" and route["source"] == "127.0.0.1"
    assert "resolve" in hostside.route_to("no-such-host.invalid")["error"]

    sock, info = hostside.listen(0)
    assert sock is not None and info["free"] and info["port"]
    try:
        assert hostside.connect("127.0.0.1", info["port"], 2.0)["ok"]
        holders = hostside.port_holders(info["port"])
        assert [h["pid"] for h in holders] == [os.getpid()]
        busy_sock, busy = hostside.listen(info["port"])
        assert busy_sock is not None  # a stand-in port
        assert not busy["free"] and busy["port"] != info["port"]
        assert [h["pid"] for h in busy["holders"]] == [os.getpid()]
        busy_sock.close()
    finally:
        sock.close()
    refused = hostside.connect("127.0.0.1", info["port"], 2.0)
    assert not refused["ok"] and "refused" in refused["error"].lower()


def test_checkpoint_dir_probe(tmp_path: Path) -> None:
    info = hostside.checkpoint_dir(str(tmp_path / "new" / "ckpt"))
    assert info["writable"] and not info["existed"] and info["free_bytes"] > 0
    assert not list((tmp_path / "new" / "ckpt").iterdir())  # the probe file is gone
    blocked = tmp_path / "file"
    blocked.write_text("x")
    bad = hostside.checkpoint_dir(str(blocked / "sub"))
    assert not bad["writable"] and "cannot create" in bad["error"]


_STALE_PROBE = (
    "import json, sys\n"
    "from corral.agent import hostfacts as hostside\n"
    "print(json.dumps(hostside.stale_processes(set(), sys.argv[1] or None)))\n"
)


def _stale_seen(job_id: str = "", *, python: list[str] | None = None) -> list[dict[str, object]]:
    """What a check session of its own (a new session, as over SSH) finds stale."""
    out = subprocess.run(
        [*(python or [sys.executable]), "-c", _STALE_PROBE, job_id],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
        start_new_session=True,
    )
    found: list[dict[str, object]] = json.loads(out.stdout)
    return found


def test_stale_processes_finds_job_processes() -> None:
    child = subprocess.Popen(["sleep", "30"], env={**os.environ, "CORRAL_JOB_ID": "stale-test-job"})
    try:
        found = _stale_seen()
        assert {"pid": child.pid, "job": "stale-test-job", "cmdline": "sleep 30"} in found
        assert all(p["pid"] != os.getpid() for p in found)
    finally:
        child.kill()
        child.wait()


def test_a_stale_process_carries_its_node_dir() -> None:
    """Which run dir (which corral installation) a leftover belongs to."""
    node_dir = "/srv/other/runs/their-job/nodes/local-0"
    env = {**os.environ, "CORRAL_JOB_ID": "their-job", "CORRAL_NODE_DIR": node_dir}
    child = subprocess.Popen(["sleep", "30"], env=env)
    try:
        found = [p for p in _stale_seen() if p["pid"] == child.pid]
        assert found == [
            {"pid": child.pid, "job": "their-job", "cmdline": "sleep 30", "node_dir": node_dir}
        ]
    finally:
        child.kill()
        child.wait()


def test_stale_processes_never_count_the_job_being_checked() -> None:
    env = {**os.environ, "CORRAL_JOB_ID": "this-job"}
    mine = subprocess.Popen(["sleep", "30"], env=env)
    # a login shell about to exec this job's agent: the job id is on its command line only
    shell = subprocess.Popen(
        ["sh", "-c", "sleep 30; exec env CORRAL_JOB_ID=this-job python3 -m corral.agent"]
    )
    try:
        assert {mine.pid, shell.pid} <= {p["pid"] for p in _stale_seen("another-job")}
        assert not {mine.pid, shell.pid} & {p["pid"] for p in _stale_seen("this-job")}
    finally:
        for proc in (mine, shell):
            proc.kill()
            proc.wait()


def test_stale_processes_skip_the_check_sessions_own_family() -> None:
    env = {**os.environ, "CORRAL_JOB_ID": "family-job"}
    child = subprocess.Popen(["sleep", "30"], env=env)  # a descendant of this process
    try:
        assert child.pid not in {p["pid"] for p in hostside.stale_processes(set())}
    finally:
        child.kill()
        child.wait()
    # the check session's parent has a job id (corral run inside a corral job): not stale
    parent = (
        "import subprocess, sys, os\n"
        "print(os.getpid(), flush=True)\n"
        "sys.exit(subprocess.run(sys.argv[1:], start_new_session=True).returncode)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", parent, sys.executable, "-c", _STALE_PROBE, ""],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
        env=env,
    )
    parent_pid, found = out.stdout.splitlines()
    assert int(parent_pid) not in {p["pid"] for p in json.loads(found)}


def test_shipped_program_runs_without_corral_installed(tmp_path: Path) -> None:
    """The host side runs under an interpreter that has no corral (system python)."""
    (tmp_path / "a.py").write_text("x = 1\n")
    params = {"code_dir": str(tmp_path), "workdir": str(tmp_path), "launcher": "python"}
    text = program(list(SHIPPED), "corral.agent.hostfacts:main", params)  # what corral ships
    python = "/usr/bin/python3" if os.path.exists("/usr/bin/python3") else sys.executable
    out = subprocess.run(
        bootstrap_argv(python), input=stdin_payload(text), capture_output=True, timeout=60
    )
    assert out.returncode == 0, out.stderr.decode(errors="replace")
    facts = json.loads(out.stdout.decode().splitlines()[0])
    assert facts["event"] == "facts"
    assert list(facts["code"]["tree"]["files"]) == ["a.py"]
    assert facts["software"]["python_executable"] == python


def test_check_local_nodes_json(tmp_path: Path) -> None:
    proc = run_corral(
        "check", "--hosts", "local:2", "--json", "--checkpoint-dir", "ck", cwd=tmp_path
    )
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    checks = {c["name"]: c for c in report["checks"]}
    assert report["overall_status"] in ("pass", "warn")
    assert checks["collective"]["status"] == "pass"  # a real all-reduce over 2 local ranks
    assert checks["checkpoint"]["hosts"]["local-0"]["detail"].startswith(str(tmp_path / "ck"))
    assert checks["code"]["status"] == "pass"


def test_run_refuses_when_master_port_is_held(tmp_path: Path) -> None:
    script = tmp_path / "t.py"
    script.write_text("print('STARTED')\n")
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        port = sock.getsockname()[1]
        proc = run_corral(
            "run",
            "--hosts",
            "local:2",
            "--master-port",
            str(port),
            "--launcher",
            "python",
            "--",
            str(script),
            cwd=tmp_path,
        )
    assert proc.returncode == 2
    assert f"PID {os.getpid()}" in proc.stderr
    assert "STARTED" not in proc.stdout


def test_run_prints_the_preflight_verdict_and_skips_it_on_request(tmp_path: Path) -> None:
    script = tmp_path / "t.py"
    script.write_text("print('STARTED', flush=True)\n")
    base = ("run", "--hosts", "local:2", "--master-port", "0", "--launcher", "python")
    checked = run_corral(*base, "--", str(script), cwd=tmp_path)
    assert checked.returncode == 0, checked.stderr
    # leftovers of other jobs are this machine's state, not this test's: a stale warning
    # (and nothing else) may come with the verdict when the suite runs beside them
    lines = checked.stderr.splitlines()
    verdict = next(line for line in lines if line.startswith("pre-flight "))
    warned = [line.split(":")[0] for line in lines if line.startswith("! ")]
    assert verdict.startswith("pre-flight ✓ pass") or (
        verdict.startswith("pre-flight ! warn") and warned == ["! stale"]
    ), checked.stderr
    skipped = run_corral(*base, "--no-preflight", "--", str(script), cwd=tmp_path)
    assert skipped.returncode == 0, skipped.stderr
    assert "pre-flight" not in skipped.stderr
    assert skipped.stdout.count("STARTED") == 2
