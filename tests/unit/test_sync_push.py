"""Pieces of the push: failure classification, destination handling, the --delete helper."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from corral.agent.fingerprint import walk
from corral.errors import ConfigError
from corral.sync.prune import prune
from corral.sync.push import (
    HostSync,
    SyncReport,
    classify_failure,
    mkdir_rsync_path,
    normalize_dest,
    prune_command,
)

REFUSED = (
    "ssh: connect to host 10.77.0.3 port 22: Connection refused\r\n"
    "rsync: connection unexpectedly closed (0 bytes received so far) [sender]\n"
    "rsync error: unexplained error (code 255) at io.c(232) [sender=3.2.7]\n"
)


@pytest.mark.parametrize(
    ("stderr", "cause"),
    [
        (REFUSED, "connection refused"),
        ("ssh: connect to host x port 22: Connection timed out\n", "timeout"),
        ("ssh: connect to host x port 22: No route to host\n", "unreachable"),
        ("ssh: Could not resolve hostname nope: Name or service not known\n", "DNS lookup failed"),
        ("root@x: Permission denied (publickey,password).\n", "auth failed"),
        (
            "No ED25519 host key is known for x and you have requested strict checking.\n"
            "Host key verification failed.\n",
            "unknown host key",
        ),
        (
            "@@@ WARNING: REMOTE HOST IDENTIFICATION HAS CHANGED! @@@\n"
            "Host key verification failed.\n",
            "host key mismatch",
        ),
        ("kex_exchange_identification: read: Connection reset by peer\n", "connection lost"),
    ],
)
def test_ssh_failures_are_unreachable_with_a_cause(stderr: str, cause: str) -> None:
    unreachable, got, message = classify_failure(255, stderr)
    assert unreachable and got == cause
    assert message.startswith("cannot connect: ")
    assert "rsync error" not in message


def test_ssh_failure_seen_by_rsync_as_a_broken_pipe_is_still_unreachable() -> None:
    stderr = (
        "ssh: connect to host n2 port 22: Connection refused\n"
        "rsync: [sender] write error: Broken pipe (32)\n"
        "rsync error: error in rsync protocol data stream (code 12) at io.c(848)\n"
    )
    unreachable, cause, message = classify_failure(12, stderr)
    assert unreachable and cause == "connection refused"
    assert message == "cannot connect: ssh: connect to host n2 port 22: Connection refused"


def test_receiver_permission_denied_is_not_auth() -> None:
    stderr = 'rsync: [receiver] mkstemp "/srv/x/.a.1" failed: Permission denied (13)\n'
    assert classify_failure(23, stderr)[:2] == (False, None)
    assert classify_failure(255, stderr)[:2] == (False, None)


def test_rsync_failures_name_the_exit_code_meaning() -> None:
    stderr = (
        'rsync: [receiver] mkstemp "/srv/x/.a.py.1" failed: Permission denied (13)\n'
        "rsync error: some files/attrs were not transferred (code 23) at main.c(1338)\n"
    )
    unreachable, cause, message = classify_failure(23, stderr)
    assert not unreachable and cause is None
    assert message.startswith("rsync exited with 23 (partial transfer due to error): ")
    assert "Permission denied" in message


def test_missing_remote_rsync() -> None:
    stderr = (
        "bash: line 1: rsync: command not found\n"
        "rsync: connection unexpectedly closed (0 bytes received so far) [sender]\n"
    )
    unreachable, _, message = classify_failure(12, stderr)
    assert not unreachable and message.startswith("rsync not found on the host")


def test_no_stderr_still_says_something() -> None:
    message = classify_failure(-9, "")[2]
    assert message == "rsync exited with -9 (killed by signal 9): no error output"


def test_normalize_dest() -> None:
    assert normalize_dest(None, "/home/me/code") == "/home/me/code"
    assert normalize_dest("", "/home/me/code") == "/home/me/code"
    assert normalize_dest("/srv/code/", "/x") == "/srv/code"
    assert normalize_dest("~/code", "/x") == "~/code"
    assert normalize_dest("/", "/x") == "/"
    with pytest.raises(ConfigError, match="--dest"):
        normalize_dest("/a\nb", "/x")


@pytest.mark.parametrize("name", ["plain", "with space", "it's", "$(touch pwned)", "-dash", "ü"])
def test_mkdir_rsync_path_creates_any_dest(tmp_path: Path, name: str) -> None:
    dest = str(tmp_path / "deep" / name)
    command = mkdir_rsync_path(dest, rsync="echo ran")
    out = subprocess.run(["sh", "-c", command], capture_output=True, text=True, cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    assert (tmp_path / "deep" / name).is_dir() and out.stdout == "ran\n"
    assert not (tmp_path / "pwned").exists()


def test_mkdir_rsync_path_home_and_relative(tmp_path: Path) -> None:
    env = dict(os.environ, HOME=str(tmp_path / "home"))
    for dest, made in (("~/a b", "home/a b"), ("rel/c", "rel/c"), ("-x", "-x")):
        out = subprocess.run(
            ["sh", "-c", mkdir_rsync_path(dest, rsync="true")], cwd=tmp_path, env=env
        )
        assert out.returncode == 0 and (tmp_path / made).is_dir(), dest


def tree(root: Path) -> None:
    for rel, text in {
        ".gitignore": "*.log\ncache/\n",
        "keep.py": "k",
        "pkg/a.py": "a",
        "pkg/old.py": "old",
        "gone/deep/x.py": "x",
        "gone/deep/run.log": "ignored, so kept",
        "lonely/only.py": "y",
        "cache/blob": "ignored dir",
        "sp ace/ünï.py": "u",
    }.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)


def test_prune_deletes_extra_keeps_ignored_and_prunes_dirs(tmp_path: Path) -> None:
    tree(tmp_path)
    keep = {os.fsencode(p) for p in (".gitignore", "keep.py", "pkg/a.py", "sp ace/ünï.py")}
    report = prune(str(tmp_path), keep)
    assert sorted(report["deleted"]) == ["gone/deep/x.py", "lonely/only.py", "pkg/old.py"]  # type: ignore[call-overload]
    assert not (tmp_path / "lonely").exists()
    assert (tmp_path / "gone/deep/run.log").exists()  # ignored: kept, so its dirs stay
    assert (tmp_path / "cache/blob").exists()
    assert (tmp_path / "sp ace/ünï.py").exists()
    assert sorted(walk(str(tmp_path))[0]) == sorted(p.decode() for p in keep)


def test_prune_refuses_root_and_tolerates_missing(tmp_path: Path) -> None:
    assert "error" in prune("/", set())
    assert prune(str(tmp_path / "missing"), set())["missing"] is True


def test_prune_command_runs_the_shipped_helper(tmp_path: Path) -> None:
    """The exact remote command, run by a local shell (as sshd would), with no corral
    importable: the helper travels on stdin, ahead of the keep list."""
    tree(tmp_path / "d")
    command, program = prune_command(str(tmp_path / "d"), sys.executable)
    assert len(command) < 2_000
    env = {"PATH": os.environ["PATH"], "HOME": str(tmp_path)}
    out = subprocess.run(
        ["sh", "-c", command],
        input=program + b"keep.py\0pkg/a.py\0.gitignore\0",
        capture_output=True,
        env=env,
        cwd=tmp_path,
    )
    assert out.returncode == 0, out.stderr
    report = json.loads(out.stdout)
    assert "sp ace/ünï.py" in report["deleted"] and report["errors"] == {}
    assert (tmp_path / "d/keep.py").exists() and not (tmp_path / "d/pkg/old.py").exists()


def test_report_exit_codes() -> None:
    ok = HostSync("a", ok=True)
    failed = HostSync("b", ok=False, error="x")
    down = HostSync("c", ok=False, unreachable=True, cause="timeout")
    assert SyncReport("/s", "/d", hosts=[ok]).exit_code == 0
    assert SyncReport("/s", "/d", hosts=[ok, failed]).exit_code == 1
    assert SyncReport("/s", "/d", hosts=[ok, failed, down]).exit_code == 2
    doc = SyncReport("/s", "/d", hosts=[ok, down]).to_json()
    assert doc["succeeded"] == 1 and doc["hosts"][1]["status"] == "unreachable"
