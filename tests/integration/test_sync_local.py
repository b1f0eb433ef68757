"""``corral sync`` with real rsync processes and a stand-in ``ssh`` that runs the
remote side here, each "host" in its own home directory (no root, no sshd).

The netns tests (``netns/test_sync.py``) do the same across real sshd hosts.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import time
from pathlib import Path

import psutil
import pytest

from corral.agent.fingerprint import build_manifest
from corral.cluster import load_cluster
from corral.sync.push import HostSync, SyncReport, sync_tree
from corral.sync.rsync_output import RsyncProgress
from corral.sync.state import sync_state, sync_status
from corral.transport.options import SshOptions
from tests.integration.conftest import SCRIPTS, corral_argv

FAKE_SSH = SCRIPTS / "fake_ssh.py"
DEST = "code"  # relative: each fake host's home


@pytest.fixture
def homes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    path = tmp_path / "homes"
    monkeypatch.setenv("FAKE_SSH_HOMES", str(path))
    monkeypatch.setenv("FAKE_SSH_LOG", str(tmp_path / "ssh.log"))
    monkeypatch.setenv("CORRAL_STATE_DIR", str(tmp_path / "state"))
    monkeypatch.delenv("FAKE_SSH_DOWN", raising=False)
    return path


def make_tree(root: Path) -> Path:
    files = {
        ".gitignore": "data/\n*.tmp\n",
        ".corralignore": "build/\n",
        "train.py": "print('train')\n",
        "pkg/__init__.py": "",
        "pkg/model.py": "W = 1\n" * 100,
        "dir with space/ünï côde.py": "x = 'ü'\n",
        "data/big.bin": "ignored by .gitignore\n",
        "scratch.tmp": "ignored\n",
        "build/out.o": "ignored by .corralignore\n",
        "__pycache__/x.pyc": "built-in ignore\n",
    }
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    (root / "link.py").symlink_to("train.py")
    return root


def sync(spec: str, src: Path, **kw: object) -> SyncReport:
    return asyncio.run(
        sync_tree(load_cluster(spec), src, DEST, SshOptions(), ssh=str(FAKE_SSH), **kw)  # type: ignore[arg-type]
    )


def copy_of(homes: Path, host: str) -> Path:
    return homes / host / DEST


def test_push_equals_the_manifest_and_is_recorded(tmp_path: Path, homes: Path) -> None:
    src = make_tree(tmp_path / "src")
    report = sync("n1,n2", src)
    assert report.ok and report.exit_code == 0, report.to_json()
    want = build_manifest(str(src))
    assert report.digest == want.digest and report.files == len(want.files) == 7
    for host in ("n1", "n2"):
        copy = copy_of(homes, host)
        assert build_manifest(str(copy)).files == want.files
        assert (copy / "link.py").is_symlink()
        for ignored in ("data", "scratch.tmp", "build", "__pycache__"):
            assert not (copy / ignored).exists(), ignored
        assert sync_state(host, DEST) is not None
    assert {r.host: r.files_transferred for r in report.hosts} == {"n1": 7, "n2": 7}
    status = sync_status(["n1", "n2", "n3"], DEST, want.digest)
    assert [status[h][0] for h in ("n1", "n2", "n3")] == ["pass", "pass", "skip"]
    (src / "train.py").write_text("print('changed')\n")
    status = sync_status(["n1"], DEST, build_manifest(str(src)).digest)
    assert status["n1"][0] == "warn"


def test_resync_sends_only_what_changed_on_that_host(tmp_path: Path, homes: Path) -> None:
    src = make_tree(tmp_path / "src")
    assert sync("n1,n2", src).ok
    (copy_of(homes, "n2") / "pkg/model.py").write_text("tampered\n")
    report = sync("n1,n2", src)
    assert report.ok
    sent = {h.host: (h.files_transferred, h.changed) for h in report.hosts}
    assert sent == {"n1": (0, []), "n2": (1, ["pkg/model.py"])}
    assert build_manifest(str(copy_of(homes, "n2"))).digest == report.digest


def test_delete_removes_extra_files_but_not_ignored_ones(tmp_path: Path, homes: Path) -> None:
    src = make_tree(tmp_path / "src")
    assert sync("n1,", src).ok
    copy = copy_of(homes, "n1")
    (copy / "extra.py").write_text("stale\n")
    (copy / "old/pkg").mkdir(parents=True)
    (copy / "old/pkg/x.py").write_text("stale\n")
    (copy / "notes.tmp").write_text("ignored: kept\n")
    without = sync("n1,", src)
    assert without.ok and (copy / "extra.py").exists()  # no --delete: left alone
    report = sync("n1,", src, delete=True)
    assert report.ok and report.hosts[0].deleted == 2
    assert not (copy / "extra.py").exists() and not (copy / "old").exists()
    assert (copy / "notes.tmp").exists()
    assert build_manifest(str(copy)).digest == report.digest


def test_unreachable_host_is_named_and_the_others_sync(
    tmp_path: Path, homes: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    src = make_tree(tmp_path / "src")
    monkeypatch.setenv("FAKE_SSH_DOWN", "n2")
    report = sync("n1,n2,n3", src)
    by_host = {h.host: h for h in report.hosts}
    assert [h.host for h in report.hosts] == ["n1", "n2", "n3"]
    assert by_host["n1"].ok and by_host["n3"].ok
    down = by_host["n2"]
    assert not down.ok and down.unreachable and down.cause == "connection refused"
    assert down.exit_code in (255, 12) and "Connection refused" in (down.error or "")
    assert report.exit_code == 2
    assert sync_state("n2", DEST) is None and sync_state("n1", DEST) is not None


def test_listener_sees_every_host(tmp_path: Path, homes: Path) -> None:
    src = make_tree(tmp_path / "src")
    events: list[tuple[str, str]] = []

    class Listener:
        def started(self, host: str) -> None:
            events.append(("started", host))

        def progress(self, host: str, progress: RsyncProgress, phase: str) -> None:
            events.append((phase, host))

        def finished(self, result: HostSync) -> None:
            events.append(("finished", result.host))

    assert sync("n1,n2", src, listener=Listener(), delete=True).ok
    for host in ("n1", "n2"):
        mine = [e for e, h in events if h == host]
        assert mine[0] == "started" and mine[-1] == "finished"
        assert "syncing" in mine and "deleting" in mine


def test_ssh_gets_corral_settings_with_spaces(
    tmp_path: Path, homes: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    src = make_tree(tmp_path / "src")
    config = tmp_path / "my conf's dir" / "ssh config"
    config.parent.mkdir()
    config.write_text("Host *\n")
    options = SshOptions(config=str(config), user="ml", port=2200)
    cluster = load_cluster("n1,")
    report = asyncio.run(sync_tree(cluster, src, DEST, options, ssh=str(FAKE_SSH)))
    assert report.ok
    calls = [json.loads(line) for line in (tmp_path / "ssh.log").read_text().splitlines()]
    argv = calls[0]
    assert argv[argv.index("-F") + 1] == str(config)
    assert argv[argv.index("-l") + 1] == "ml" and argv[argv.index("-p") + 1] == "2200"
    assert "BatchMode=yes" in argv and "StrictHostKeyChecking=yes" in argv
    assert "ConnectTimeout=10" in argv  # the config sets none


def test_local_cluster_pushes_nothing(tmp_path: Path, homes: Path) -> None:
    src = make_tree(tmp_path / "src")
    report = sync("local:2", src)
    assert report.local and report.ok and report.hosts == []
    assert not homes.exists()


# -- the CLI, with the stand-in ssh first on PATH ----------------------------------------


def cli_env(tmp_path: Path) -> dict[str, str]:
    """Our environment without CORRAL_*, the stand-in ssh first on PATH."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    if not (bin_dir / "ssh").exists():
        (bin_dir / "ssh").symlink_to(FAKE_SSH)
    env = {k: v for k, v in os.environ.items() if not k.startswith("CORRAL_")}
    env.update(
        PATH=f"{bin_dir}{os.pathsep}{os.environ['PATH']}",
        CORRAL_STATE_DIR=str(tmp_path / "state"),
        FAKE_SSH_HOMES=str(tmp_path / "homes"),
        NO_COLOR="1",
        COLUMNS="200",
    )
    return env


def cli(tmp_path: Path, *args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        corral_argv("sync", *args),
        capture_output=True,
        text=True,
        env=cli_env(tmp_path),
        timeout=120,
        cwd=cwd or tmp_path,
    )


def test_cli_plain_lines_and_summary(tmp_path: Path) -> None:
    src = make_tree(tmp_path / "src")
    out = cli(tmp_path, "--hosts", "n1,n2", "--dest", DEST, cwd=src)  # SRC defaults to "."
    assert out.returncode == 0, out.stderr
    lines = out.stderr.splitlines()
    assert any(line.startswith("[n1] ok: 7 files") for line in lines), out.stderr
    header = next(line for line in lines if line.startswith("host"))
    assert header.split() == ["host", "files", "MB", "sent", "seconds", "status"]
    assert "2/2 hosts synced" in out.stderr and out.stdout == ""
    assert (tmp_path / "homes/n2/code/train.py").exists()


def test_cli_json_with_a_hostfile_and_delete(tmp_path: Path) -> None:
    src = make_tree(tmp_path / "src")
    hostfile = tmp_path / "hosts"
    hostfile.write_text("n1\nn2\n")
    out = cli(tmp_path, "--hosts", str(hostfile), str(src), "--dest", DEST, "--json", "--delete")
    doc = json.loads(out.stdout)
    assert out.returncode == 0 and doc["ok"] and doc["succeeded"] == 2 and doc["delete"]


def test_cli_unreachable_host_exits_2(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    src = make_tree(tmp_path / "src")
    monkeypatch.setenv("FAKE_SSH_DOWN", "n2")
    out = cli(tmp_path, "--hosts", "n1,n2", str(src), "--dest", DEST)
    assert out.returncode == 2
    assert "n2: cannot connect" in out.stderr and "1/2 hosts synced" in out.stderr


def test_cli_failing_sync_script_blocks(tmp_path: Path) -> None:
    src = make_tree(tmp_path / "src")
    script = tmp_path / "sync.sh"
    script.write_text("#!/bin/sh\necho pushing data for $CORRAL_HOST_NAMES\nexit 3\n")
    script.chmod(0o755)
    out = cli(tmp_path, "--hosts", "n1,", str(src), "--dest", DEST, "--sync-script", str(script))
    assert out.returncode == 1
    assert "[sync-script] pushing data for n1" in out.stderr
    assert "exit code 3" in out.stderr and "nothing was pushed" in out.stderr
    assert not (tmp_path / "homes").exists()
    out = cli(
        tmp_path, "--hosts", "n1,", str(src), "--dest", DEST, "--sync-script", str(script), "--json"
    )
    doc = json.loads(out.stdout)
    assert out.returncode == 1 and doc["script"]["exit_code"] == 3 and not doc["ok"]


def test_cli_missing_sync_script_warns_and_syncs(tmp_path: Path) -> None:
    src = make_tree(tmp_path / "src")
    out = cli(tmp_path, "--hosts", "n1,", str(src), "--dest", DEST, "--sync-script", "nope.sh")
    assert out.returncode == 0, out.stderr
    assert "warning: sync script nope.sh not found" in out.stderr
    assert (tmp_path / "homes/n1/code/train.py").exists()


def test_cli_bad_input_exits_2(tmp_path: Path) -> None:
    out = cli(tmp_path, "--hosts", "n1,", str(tmp_path / "missing"))
    assert out.returncode == 2 and "SRC: source directory" in out.stderr
    out = cli(tmp_path, str(tmp_path))
    assert out.returncode == 2 and "--hosts" in out.stderr
    out = cli(tmp_path, "--hosts", "n1,", str(tmp_path), "--ssh-password-env", "CORRAL_NOPE_PW")
    assert out.returncode == 2 and "CORRAL_NOPE_PW is not set" in out.stderr
    assert "Traceback" not in out.stderr


def test_cli_local_cluster(tmp_path: Path) -> None:
    out = cli(tmp_path, "--hosts", "local:2", str(tmp_path))
    assert out.returncode == 0 and "nothing to push" in out.stderr


def cmdline(proc: psutil.Process) -> list[str]:
    try:
        return list(proc.cmdline())
    except psutil.Error:  # already gone, or a zombie
        return []


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_cli_ctrl_c_stops_every_rsync(tmp_path: Path, signum: int) -> None:
    src = make_tree(tmp_path / "src")
    env = cli_env(tmp_path)
    env.update(FAKE_SSH_SLEEP="60", FAKE_SSH_LOG=str(tmp_path / "ssh.log"))
    proc = subprocess.Popen(
        corral_argv("sync", "--hosts", "n1,n2", str(src), "--dest", DEST),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    try:
        log = tmp_path / "ssh.log"
        deadline = time.monotonic() + 30
        while not (log.exists() and len(log.read_text().splitlines()) == 2):
            if proc.poll() is not None or time.monotonic() > deadline:
                logged = log.read_text() if log.exists() else "(no ssh.log)"
                pytest.fail(
                    f"expected 2 ssh connects within 30 s (corral exit {proc.poll()}): {logged!r}"
                )
            time.sleep(0.05)
        children = psutil.Process(proc.pid).children(recursive=True)
        ssh = str(tmp_path / "bin" / "ssh")
        assert sum(ssh in cmdline(c) for c in children) == 2  # one per host, mid-"connect"
        proc.send_signal(signum)
        _, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130 and "interrupted" in err and "Traceback" not in err, err
    _, alive = psutil.wait_procs(children, timeout=10)
    assert alive == []
