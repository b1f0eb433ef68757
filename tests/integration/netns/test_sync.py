"""``corral sync`` across the netns testbed's real sshd hosts (tb1..tb3).

Each host has a private ``/srv/corral``; everything else of the filesystem is
shared with the coordinator, so destinations live under ``/srv/corral`` and a
host's copy is inspected from inside the host (``tb.run_on``).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from corral.agent.fingerprint import build_manifest
from corral.testbed import Testbed

from .test_ssh_transport import password_sshd

pytestmark = pytest.mark.netns

HOSTS = ("tb1", "tb2", "tb3")
_MANIFEST = (
    "import json, sys; from corral.agent.fingerprint import build_manifest; "
    "print(json.dumps(build_manifest(sys.argv[1]).files))"
)
__all__ = ["password_sshd"]  # a fixture, imported for the password test


@pytest.fixture
def dest(testbed: Testbed) -> Iterator[str]:
    """A fresh destination under every host's private /srv/corral, removed afterwards."""
    path = f"/srv/corral/code {uuid.uuid4().hex[:8]} ü"
    yield path
    for h in HOSTS:
        testbed.run_on(h, ["rm", "-rf", path])


def make_tree(root: Path) -> Path:
    files = {
        ".gitignore": "*.ckpt\n",
        ".corralignore": "datasets/\n",
        "train.py": "print('train')\n",
        "pkg/__init__.py": "",
        "pkg/model.py": "LAYERS = 4\n" * 50,
        "dir with space/ünï côde ✓.py": "x = 1\n",
        "weights.ckpt": "ignored by .gitignore\n",
        "datasets/part-0.bin": "ignored by .corralignore\n",
    }
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    return root


def corral_sync(
    tb: Testbed, tmp_path: Path, *args: str, config: Path | None = None
) -> tuple[int, dict[str, Any], str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("CORRAL_")}
    env.update(CORRAL_STATE_DIR=str(tmp_path / "state"), NO_COLOR="1", COLUMNS="200")
    argv = [
        sys.executable,
        "-m",
        "corral",
        "sync",
        "--ssh-config",
        str(config or tb.ssh_config),
        "--json",
        *args,
    ]
    if "--hosts" not in args:
        argv += ["--hosts", str(tb.hostfile)]
    out = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=120)
    try:
        doc = json.loads(out.stdout)
    except ValueError:
        doc = {}
    return out.returncode, doc, out.stderr


def host_files(tb: Testbed, host: str, path: str) -> dict[str, str]:
    out = tb.run_on(host, [sys.executable, "-c", _MANIFEST, path], check=True)
    files: dict[str, str] = json.loads(out.stdout)
    return files


def by_host(doc: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {h["host"]: h for h in doc["hosts"]}


def test_every_host_gets_the_manifest_and_ignored_files_stay_home(
    testbed: Testbed, tmp_path: Path, dest: str
) -> None:
    src = make_tree(tmp_path / "src")
    code, doc, err = corral_sync(testbed, tmp_path, str(src), "--dest", dest)
    assert code == 0, err
    want = build_manifest(str(src))
    assert doc["digest"] == want.digest and doc["files"] == len(want.files) == 6
    assert "dir with space/ünï côde ✓.py" in want.files
    for h in HOSTS:
        assert host_files(testbed, h, dest) == want.files, h
        listing = testbed.run_on(h, ["find", dest], check=True).stdout
        assert "weights.ckpt" not in listing and "datasets" not in listing
        assert by_host(doc)[h]["files_transferred"] == 6
    state = json.loads((tmp_path / "state/sync-state.json").read_text())
    assert {(e["host"], e["dest"], e["digest"]) for e in state["entries"]} == {
        (h, dest, want.digest) for h in HOSTS
    }


def test_a_changed_host_is_fixed_and_only_it_transfers(
    testbed: Testbed, tmp_path: Path, dest: str
) -> None:
    src = make_tree(tmp_path / "src")
    assert corral_sync(testbed, tmp_path, str(src), "--dest", dest)[0] == 0
    target = f"{dest}/pkg/model.py"
    testbed.run_on("tb2", ["sh", "-c", 'echo tampered > "$1"', "sh", target], check=True)
    assert host_files(testbed, "tb2", dest) != build_manifest(str(src)).files
    code, doc, err = corral_sync(testbed, tmp_path, str(src), "--dest", dest)
    assert code == 0, err
    sent = {h: r["files_transferred"] for h, r in by_host(doc).items()}
    assert sent == {"tb1": 0, "tb2": 1, "tb3": 0}
    assert host_files(testbed, "tb2", dest) == build_manifest(str(src)).files


def test_delete_removes_extra_files_and_keeps_ignored_ones(
    testbed: Testbed, tmp_path: Path, dest: str
) -> None:
    src = make_tree(tmp_path / "src")
    assert corral_sync(testbed, tmp_path, str(src), "--dest", dest)[0] == 0
    script = (
        'cd "$1" && echo stale > stale.py && mkdir -p old/sub && echo x > old/sub/x.py '
        "&& echo keep > run-7.ckpt && mkdir -p datasets && echo keep > datasets/more.bin"
    )
    testbed.run_on("tb3", ["sh", "-c", script, "sh", dest], check=True)
    code, doc, err = corral_sync(testbed, tmp_path, str(src), "--dest", dest, "--delete")
    assert code == 0, err
    assert by_host(doc)["tb3"]["deleted"] == 2 and by_host(doc)["tb1"]["deleted"] == 0
    listing = testbed.run_on("tb3", ["find", dest], check=True).stdout
    assert "stale.py" not in listing and "/old" not in listing
    assert f"{dest}/run-7.ckpt" in listing and f"{dest}/datasets/more.bin" in listing
    assert host_files(testbed, "tb3", dest) == build_manifest(str(src)).files


def test_unreachable_host_is_named_and_the_others_sync(
    healthy_testbed: Testbed, tmp_path: Path, dest: str
) -> None:
    src = make_tree(tmp_path / "src")
    healthy_testbed.kill_sshd("tb2")
    code, doc, _ = corral_sync(healthy_testbed, tmp_path, str(src), "--dest", dest)
    assert code == 2
    hosts = by_host(doc)
    assert hosts["tb2"]["status"] == "unreachable" and hosts["tb2"]["cause"] == "connection refused"
    assert healthy_testbed.host("tb2").address in hosts["tb2"]["error"]
    assert hosts["tb1"]["ok"] and hosts["tb3"]["ok"]
    want = build_manifest(str(src)).files
    assert host_files(healthy_testbed, "tb1", dest) == want
    assert host_files(healthy_testbed, "tb3", dest) == want
    state = json.loads((tmp_path / "state/sync-state.json").read_text())
    assert sorted(e["host"] for e in state["entries"]) == ["tb1", "tb3"]


def test_plain_output_names_the_unreachable_host(
    healthy_testbed: Testbed, tmp_path: Path, dest: str
) -> None:
    src = make_tree(tmp_path / "src")
    healthy_testbed.kill_sshd("tb3")
    env = {k: v for k, v in os.environ.items() if not k.startswith("CORRAL_")}
    env.update(CORRAL_STATE_DIR=str(tmp_path / "state"), NO_COLOR="1", COLUMNS="200")
    argv = [sys.executable, "-m", "corral", "sync", "--hosts", str(healthy_testbed.hostfile)]
    argv += ["--ssh-config", str(healthy_testbed.ssh_config), str(src), "--dest", dest]
    out = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=120)
    assert out.returncode == 2
    assert re.search(r"^\s*tb3: cannot connect: .*Connection refused", out.stderr, re.M)
    assert re.search(r"^tb1\s+6\s+\S+\s+\S+\s+ok\s*$", out.stderr, re.M), out.stderr
    assert "2/3 hosts synced" in out.stderr


def test_unknown_host_key_is_refused_unless_accept_new(
    testbed: Testbed, tmp_path: Path, dest: str
) -> None:
    src = make_tree(tmp_path / "src")
    known = tmp_path / "known_hosts"
    config = tmp_path / "ssh_config"
    config.write_text(
        re.sub(
            r"(?m)^(\s*UserKnownHostsFile)\s+\S+", rf"\1 {known}", testbed.ssh_config.read_text()
        )
    )
    args = ("--hosts", "tb1,", str(src), "--dest", dest)
    code, doc, _ = corral_sync(testbed, tmp_path, *args, config=config)
    assert code == 2 and doc["hosts"][0]["cause"] == "unknown host key"
    code, doc, err = corral_sync(testbed, tmp_path, *args, "--accept-new-host-keys", config=config)
    assert code == 0, err
    assert known.read_text().startswith(f"{testbed.host('tb1').address} ")


def test_proxyjump_from_the_ssh_config(testbed: Testbed, tmp_path: Path, dest: str) -> None:
    src = make_tree(tmp_path / "src")
    config = tmp_path / "ssh_config"
    config.write_text(
        testbed.ssh_config.read_text()
        + f"\nHost tb3-via-tb1\n    HostName {testbed.host('tb3').address}\n    ProxyJump tb1\n"
        f"    User root\n    IdentityFile {testbed.key_path}\n"
        f"    UserKnownHostsFile {testbed.known_hosts}\n"
    )
    code, _, err = corral_sync(
        testbed, tmp_path, "--hosts", "tb3-via-tb1,", str(src), "--dest", dest, config=config
    )
    assert code == 0, err
    assert host_files(testbed, "tb3", dest) == build_manifest(str(src)).files


def test_password_from_env_var_via_askpass(
    password_sshd: tuple[Path, str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    config, password = password_sshd
    src = make_tree(tmp_path / "src")
    target = tmp_path / "dest on host"
    monkeypatch.delenv("SSH_AUTH_SOCK", raising=False)
    env = {k: v for k, v in os.environ.items() if not k.startswith("CORRAL_")}
    env.update(CORRAL_STATE_DIR=str(tmp_path / "state"), CORRAL_TEST_PW=password)
    argv = [sys.executable, "-m", "corral", "sync", "--hosts", "pwhost,", "--ssh-config"]
    argv += [str(config), "--ssh-password-env", "CORRAL_TEST_PW", str(src), "--dest"]
    argv += [str(target), "--json", "--delete"]
    out = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=120)
    assert out.returncode == 0, out.stderr
    assert build_manifest(str(target)).files == build_manifest(str(src)).files
    assert password not in out.stdout + out.stderr
    env["CORRAL_TEST_PW"] = "wrong-" + password
    out = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=120)
    doc = json.loads(out.stdout)
    assert out.returncode == 2 and doc["hosts"][0]["cause"] == "auth failed"
    assert password not in out.stdout + out.stderr
