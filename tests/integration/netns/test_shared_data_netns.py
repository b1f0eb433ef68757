"""``--shared-data-path`` on the testbed (real sshd per host): `corral check` and
`corral run`'s pre-flight verify that every host sees one filesystem at the path.

The test's ``tmp_path`` is one directory every host sees (a shared filesystem);
each host's ``/srv`` is its own (a per-host disk).
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from corral.testbed import Testbed

from ..conftest import run_corral

pytestmark = pytest.mark.netns

HOSTS = ["tb1", "tb2", "tb3"]
MARKER_GLOB = ".corral-shared-check-*"


def _cluster(testbed: Testbed, tmp_path: Path) -> list[str]:
    hostfile = tmp_path / "hosts"
    hostfile.write_text("".join(f"{n} slots=1\n" for n in HOSTS))
    return ["--hosts", str(hostfile), "--ssh-config", str(testbed.ssh_config)]


def _check(
    testbed: Testbed, tmp_path: Path, path: str, *extra: str
) -> subprocess.CompletedProcess[str]:
    argv = ["check", *_cluster(testbed, tmp_path), "--no-smoke-test", "--shared-data-path", path]
    return run_corral(*argv, *extra, cwd=tmp_path, timeout=180, env={"NO_COLOR": "1"})


def _shared_check(testbed: Testbed, tmp_path: Path, path: str) -> tuple[int, dict[str, Any]]:
    proc = _check(testbed, tmp_path, path, "--json")
    assert proc.stdout.strip(), proc.stderr
    checks = {c["name"]: c for c in json.loads(proc.stdout)["checks"]}
    others = {n: c["error"] for n, c in checks.items() if c["status"] == "fail"}
    others.pop("shared_data", None)
    assert not others, others  # only the shared data path is at stake here
    return proc.returncode, checks["shared_data"]


def _on_host(testbed: Testbed, host: str, script: str) -> None:
    out = testbed.run_on(host, ["sh", "-c", script])
    assert out.returncode == 0, out.stderr


@pytest.fixture
def per_host_dir(testbed: Testbed, tmp_path: Path) -> Iterator[str]:
    """``/srv/corral/sd-NAME``: a directory of the same path on every host, each its own."""
    path = f"/srv/corral/sd-{tmp_path.name}"
    for host in HOSTS:
        _on_host(testbed, host, f"mkdir -p {path}")
    yield path
    for host in HOSTS:
        testbed.run_on(host, ["rm", "-rf", path])


def test_a_shared_directory_passes_on_every_host_and_the_marker_is_removed(
    testbed: Testbed, tmp_path: Path
) -> None:
    data = tmp_path / "data"
    data.mkdir()
    code, result = _shared_check(testbed, tmp_path, str(data))
    assert code == 0, result
    assert result["status"] == "pass", result
    assert {h: c["status"] for h, c in result["hosts"].items()} == dict.fromkeys(HOSTS, "pass")
    assert result["data"]["writer"] == "tb1"
    assert "wrote the marker" in result["hosts"]["tb1"]["detail"]
    for host in ("tb2", "tb3"):
        assert "sees the marker from tb1" in result["hosts"][host]["detail"]
    for host in HOSTS:
        seen = result["data"]["hosts"][host]
        assert seen["exists"] and seen["sees_marker"]
        assert seen["fs_type"] and seen["mount_point"] and seen["free_bytes"] > 0
        assert "GiB free" in result["hosts"][host]["detail"]
    assert list(data.glob(MARKER_GLOB)) == []


def test_per_host_directories_fail_naming_the_hosts_with_the_fix(
    testbed: Testbed, tmp_path: Path, per_host_dir: str
) -> None:
    code, result = _shared_check(testbed, tmp_path, per_host_dir)
    assert code == 1
    assert result["status"] == "fail"
    assert result["hosts"]["tb1"]["status"] == "pass"  # it wrote the marker
    for host in ("tb2", "tb3"):
        detail = result["hosts"][host]["detail"]
        assert result["hosts"][host]["status"] == "fail"
        assert "does not see the marker from tb1: a different filesystem here" in detail
        assert not result["data"]["hosts"][host]["sees_marker"]
    assert result["error"].startswith(f"tb2, tb3 do not see the marker written in {per_host_dir}")
    fix = result["fix_command"]
    assert "mount" in fix and f"at {per_host_dir} on tb2, tb3" in fix
    assert f"tb2 'sudo mkdir -p {per_host_dir} && sudo mount -t nfs" in fix
    assert str(testbed.ssh_config) in fix  # copy-pasteable: reaches the host as corral does
    for host in HOSTS:
        assert list(testbed.host_path(host, per_host_dir).glob(MARKER_GLOB)) == []

    # the console report: one line naming the hosts, then the fix
    human = _check(testbed, tmp_path, per_host_dir)
    assert human.returncode == 1
    line = next(li for li in human.stderr.splitlines() if "shared_data:" in li)
    assert "fail" in line and "tb2, tb3" in line
    assert "fix: " in human.stderr and "sudo mount -t nfs" in human.stderr
    assert "Traceback" not in human.stderr


def test_a_path_missing_on_one_host_fails_naming_it(testbed: Testbed, tmp_path: Path) -> None:
    data = tmp_path / "data"
    data.mkdir()
    link = f"/srv/corral/sd-link-{tmp_path.name}"  # tb1 and tb2 reach the shared dir there
    for host in ("tb1", "tb2"):
        _on_host(testbed, host, f"mkdir -p /srv/corral && ln -s {data} {link}")
    try:
        code, result = _shared_check(testbed, tmp_path, link)
    finally:
        for host in ("tb1", "tb2"):
            testbed.run_on(host, ["rm", "-f", link])
    assert code == 1
    assert result["status"] == "fail"
    assert {h: c["status"] for h, c in result["hosts"].items()} == {
        "tb1": "pass",
        "tb2": "pass",
        "tb3": "fail",
    }
    assert result["hosts"]["tb3"]["detail"] == f"{link} does not exist"
    assert result["error"] == f"{link} does not exist on tb3"
    fix = result["fix_command"]
    assert "on tb3: " in fix and f"tb3 'sudo mkdir -p {link} && sudo mount" in fix
    assert "tb1 '" not in fix and "tb2 '" not in fix
    assert list(data.glob(MARKER_GLOB)) == []


def test_a_read_only_first_host_hands_the_marker_to_the_next(
    testbed: Testbed, tmp_path: Path
) -> None:
    data = tmp_path / "data"
    data.mkdir()
    # a read-only bind mount over the shared directory, in tb1's mount namespace only
    _on_host(testbed, "tb1", f"mount --bind {data} {data} && mount -o remount,bind,ro {data}")
    try:
        code, result = _shared_check(testbed, tmp_path, str(data))
    finally:
        _on_host(testbed, "tb1", f"umount {data}")
    assert code == 0, result
    assert result["status"] == "pass"
    assert result["data"]["writer"] == "tb2"
    assert "sees the marker from tb2" in result["hosts"]["tb1"]["detail"]
    assert list(data.glob(MARKER_GLOB)) == []


def test_a_path_missing_everywhere_fails_with_its_own_sentence(
    testbed: Testbed, tmp_path: Path
) -> None:
    missing = str(tmp_path / "nowhere")
    code, result = _shared_check(testbed, tmp_path, missing)
    assert code == 1
    assert result["error"] == f"{missing} does not exist on any host"
    # the testbed's hosts are one machine (one boot id): creating it once makes it shared
    assert result["fix_command"] == f"mkdir -p {missing}"


def test_bad_option_is_a_config_error(testbed: Testbed, tmp_path: Path) -> None:
    proc = _check(testbed, tmp_path, "data/relative")
    assert proc.returncode == 2
    assert "--shared-data-path" in proc.stderr and "relative" in proc.stderr
    assert "Traceback" not in proc.stderr


def _job(tmp_path: Path) -> Path:
    script = tmp_path / "train.py"
    script.write_text(
        "import os, socket\n"
        "path = os.environ['CORRAL_SHARED_DATA_PATH']\n"
        "print('host', socket.gethostname(), 'reads', open(path + '/input.txt').read().strip(),"
        " flush=True)\n"
    )
    return script


def test_run_is_blocked_by_a_per_host_path_and_runs_on_a_shared_one(
    testbed: Testbed, tmp_path: Path, per_host_dir: str, run_dir: Path
) -> None:
    _job(tmp_path)
    common = [*_cluster(testbed, tmp_path), "--workdir", str(tmp_path)]
    common += ["--run-dir", str(run_dir), "--launcher", "python"]
    refused = run_corral(
        "run", *common, "--shared-data-path", per_host_dir, "--", "train.py", cwd=tmp_path
    )
    assert refused.returncode == 2, refused.stderr
    assert "pre-flight checks failed: shared_data" in refused.stderr
    assert "tb2, tb3 do not see the marker written in" in refused.stderr
    assert "host tb" not in refused.stdout  # nothing was launched

    data = tmp_path / "data"
    data.mkdir()
    (data / "input.txt").write_text("tokens\n")
    ran = run_corral(
        "run", *common, "--shared-data-path", str(data), "--", "train.py", cwd=tmp_path
    )
    assert ran.returncode == 0, ran.stderr
    for host in HOSTS:
        assert f"host {host} reads tokens" in ran.stdout
    assert list(data.glob(MARKER_GLOB)) == []
