"""`corral check` and `corral run`'s pre-flight on the testbed (real sshd per host).

Each host has a private /srv, /tmp and home (the rest of the filesystem is shared
with the coordinator), so per-host differences (code, packages, full disks) live there.
"""

from __future__ import annotations

import json
import shlex
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jsonschema
import pytest

from corral.testbed import Testbed

from ..conftest import run_corral

pytestmark = pytest.mark.netns

HOSTS = ["tb1", "tb2", "tb3"]

_HOST = {
    "type": "object",
    "required": ["status", "detail"],
    "properties": {
        "status": {"enum": ["pass", "warn", "fail", "skip"]},
        "detail": {"type": "string"},
    },
}
REPORT_SCHEMA: dict[str, Any] = {
    "type": "object",
    "required": ["checks", "overall_status", "block_on_failure", "hosts"],
    "properties": {
        "overall_status": {"enum": ["pass", "warn", "fail"]},
        "block_on_failure": {"type": "boolean"},
        "hosts": {"type": "array", "items": {"type": "string"}},
        "interfaces": {"type": "object", "additionalProperties": {"type": "string"}},
        "excluded": {"type": "array", "items": {"type": "string"}},
        "checks": {
            "type": "array",
            "minItems": 10,
            "items": {
                "type": "object",
                "required": ["name", "status", "hosts", "error", "warning", "fix_command"],
                "properties": {
                    "name": {
                        "enum": [
                            "connectivity",
                            "hardware",
                            "software",
                            "code",
                            "network",
                            "checkpoint",
                            "clock",
                            "stale",
                            "gpu",
                            "collective",
                            "sync",
                        ]
                    },
                    "status": {"enum": ["pass", "warn", "fail", "skip"]},
                    "hosts": {"type": "object", "additionalProperties": _HOST},
                    "error": {"type": ["string", "null"]},
                    "warning": {"type": ["string", "null"]},
                    "fix_command": {"type": ["string", "null"]},
                    "summary": {"type": "string"},
                    "duration_s": {"type": "number"},
                    "data": {"type": "object"},
                },
            },
        },
    },
}


def _hostfile(tmp_path: Path, names: list[str], slots: int = 1, extra: str = "") -> str:
    path = tmp_path / "hosts"
    path.write_text("".join(f"{n} slots={slots}{extra}\n" for n in names))
    return str(path)


def _check(
    testbed: Testbed,
    tmp_path: Path,
    *args: str,
    names: list[str] = HOSTS,
    hosts: str = "",
    env: dict[str, str] | None = None,
) -> tuple[subprocess.CompletedProcess[str], dict[str, Any]]:
    argv = [
        "check",
        "--hosts",
        hosts or _hostfile(tmp_path, names),
        "--ssh-config",
        str(testbed.ssh_config),
        "--json",
        *args,
    ]
    proc = run_corral(*argv, cwd=tmp_path, timeout=180, env=env)
    assert proc.stdout.strip(), proc.stderr
    report = json.loads(proc.stdout)
    jsonschema.validate(report, REPORT_SCHEMA)
    return proc, report


def _by_name(report: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {c["name"]: c for c in report["checks"]}


def _failed(report: dict[str, Any]) -> list[tuple[str, str | None]]:
    return [(c["name"], c["error"]) for c in report["checks"] if c["status"] == "fail"]


def _on_host(testbed: Testbed, host: str, script: str) -> None:
    out = testbed.run_on(host, ["sh", "-c", script])
    assert out.returncode == 0, out.stderr


@pytest.fixture
def code_tree(testbed: Testbed, tmp_path: Path) -> Iterator[tuple[Path, str]]:
    """A code tree here and an identical copy at the same path on every host."""
    src = tmp_path / "proj"
    (src / "pkg").mkdir(parents=True)
    (src / "train.py").write_text(
        "import os, socket\n"
        "print('host', socket.gethostname(), 'world', os.environ['WORLD_SIZE'],"
        " 'iface', os.environ.get('GLOO_SOCKET_IFNAME'), flush=True)\n"
    )
    (src / "pkg" / "model.py").write_text("LAYERS = 4\n")
    (src / ".gitignore").write_text("outputs/\n")
    (src / "outputs").mkdir()
    (src / "outputs" / "ignored.bin").write_text("not code")
    dest = f"/srv/corral/code-{tmp_path.name}"
    for host in HOSTS:
        _on_host(testbed, host, f"rm -rf {dest} && cp -a {src} {dest}")
    yield src, dest
    for host in HOSTS:
        testbed.run_on(host, ["rm", "-rf", dest])


def test_healthy_testbed_passes_with_interfaces_and_smoke_test(
    testbed: Testbed, tmp_path: Path, code_tree: tuple[Path, str]
) -> None:
    src, dest = code_tree
    proc, report = _check(
        testbed,
        tmp_path,
        "--workdir",
        dest,
        "--code-dir",
        str(src),
        "--checkpoint-dir",
        "/srv/corral/ckpt-ok",
        "--min-free-gb",
        "0.01",
        "--",
        "train.py",
    )
    checks = _by_name(report)
    assert proc.returncode == 0, proc.stderr
    assert report["overall_status"] in ("pass", "warn")
    assert [c["name"] for c in report["checks"]][:4] == [
        "connectivity",
        "hardware",
        "software",
        "code",
    ]
    for name in ("connectivity", "software", "code", "network", "checkpoint", "collective"):
        assert checks[name]["status"] == "pass", checks[name]
    # every namespace's own device, found by route (the names differ per host)
    assert report["interfaces"] == {h: testbed.host(h).interface for h in HOSTS}
    assert checks["code"]["data"]["ratio"] == 1.0
    assert checks["collective"]["data"]["bus_bandwidth_gbps"] > 0
    assert checks["collective"]["data"]["world_size"] == 3
    for h in HOSTS:
        assert "/srv/corral/ckpt-ok" in checks["checkpoint"]["hosts"][h]["detail"]


def test_changed_file_on_one_host_is_named_and_excluded(
    testbed: Testbed, tmp_path: Path, code_tree: tuple[Path, str], run_dir: Path
) -> None:
    src, dest = code_tree
    # same size, same second: rsync's default quick check would call it unchanged
    _on_host(testbed, "tb3", f"echo 'LAYERS = 5' > {dest}/pkg/model.py")
    _on_host(testbed, "tb3", f"echo junk > {dest}/outputs/other.bin")  # ignored: no matter
    proc, report = _check(
        testbed, tmp_path, "--workdir", dest, "--code-dir", str(src), "--no-smoke-test"
    )
    code = _by_name(report)["code"]
    assert proc.returncode == 1
    assert code["status"] == "fail"
    assert code["hosts"]["tb3"]["status"] == "fail"
    assert "pkg/model.py" in code["hosts"]["tb3"]["detail"]
    assert {code["hosts"][h]["status"] for h in ("tb1", "tb2")} == {"pass"}
    assert code["data"]["divergent"]["tb3"]["changed"] == ["pkg/model.py"]
    assert "tb3" in code["error"] and "corral sync" in code["fix_command"]

    # corral sync brings tb3 back in line; the sync check then says so
    state = tmp_path / "state"
    env_state = {"CORRAL_STATE_DIR": str(state)}
    synced = run_corral(
        "sync",
        "--hosts",
        _hostfile(tmp_path, HOSTS),
        "--ssh-config",
        str(testbed.ssh_config),
        str(src),
        "--dest",
        dest,
        cwd=tmp_path,
        env=env_state,
    )
    assert synced.returncode == 0, synced.stderr
    proc, after = _check(
        testbed,
        tmp_path,
        "--workdir",
        dest,
        "--code-dir",
        str(src),
        "--no-smoke-test",
        env=env_state,
    )
    assert proc.returncode == 0, (_failed(after), synced.stderr)
    assert _by_name(after)["code"]["status"] == "pass"
    assert {c["status"] for c in _by_name(after)["sync"]["hosts"].values()} == {"pass"}
    _on_host(testbed, "tb3", f"echo 'LAYERS = 5' > {dest}/pkg/model.py")

    # the seed's 0.95 threshold: 2 of 3 is still below it; 0.6 lets one host differ (warn)
    _, lenient = _check(
        testbed,
        tmp_path,
        "--workdir",
        dest,
        "--code-dir",
        str(src),
        "--no-smoke-test",
        "--consistency-threshold",
        "0.6",
    )
    assert _by_name(lenient)["code"]["status"] == "warn"

    # the launch is refused ...
    common = ["--hosts", _hostfile(tmp_path, HOSTS), "--ssh-config", str(testbed.ssh_config)]
    common += ["--workdir", dest, "--code-dir", str(src), "--run-dir", str(run_dir)]
    refused = run_corral("run", *common, "--launcher", "python", "--", "train.py", cwd=tmp_path)
    assert refused.returncode == 2, refused.stderr
    assert "pkg/model.py" in refused.stderr and "pre-flight checks failed: code" in refused.stderr
    assert "host tb" not in refused.stdout

    # ... unless the divergent host is left out: the job runs on the other two
    ran = run_corral(
        "run",
        *common,
        "--exclude-divergent",
        "--launcher",
        "python",
        "--",
        "train.py",
        cwd=tmp_path,
    )
    assert ran.returncode == 0, ran.stderr
    assert "tb3 left out" in ran.stderr
    assert "host tb1 world 2" in ran.stdout and "host tb2 world 2" in ran.stdout
    assert "host tb3" not in ran.stdout


def test_unreachable_master_port_refuses_launch_before_anything_starts(
    healthy_testbed: Testbed, tmp_path: Path, run_dir: Path
) -> None:
    tb = healthy_testbed
    master = tb.host("tb1").address
    # tb3 can still talk to the coordinator (ssh) but not to the master host
    _on_host(tb, "tb3", f"ip route add unreachable {master}/32")
    try:
        proc, report = _check(tb, tmp_path, "--no-smoke-test")
        network = _by_name(report)["network"]
        assert proc.returncode == 1
        assert network["status"] == "fail"
        assert network["hosts"]["tb3"]["status"] == "fail"
        assert "cannot reach" in network["hosts"]["tb3"]["detail"]
        assert {network["hosts"][h]["status"] for h in ("tb1", "tb2")} == {"pass"}

        script = tmp_path / "marker.py"
        script.write_text("print('TRAINING STARTED', flush=True)\n")
        refused = run_corral(
            "run",
            "--hosts",
            _hostfile(tmp_path, HOSTS),
            "--ssh-config",
            str(tb.ssh_config),
            "--run-dir",
            str(run_dir),
            "--launcher",
            "python",
            "--",
            str(script),
            cwd=tmp_path,
        )
        assert refused.returncode == 2
        assert "pre-flight checks failed: network" in refused.stderr
        assert "tb3" in refused.stderr
        assert "TRAINING STARTED" not in refused.stdout
        assert not list(run_dir.glob("*/plan.json"))  # nothing was launched
        for host in HOSTS:
            assert tb.pids_on(host) == [], host
    finally:
        tb.run_on("tb3", ["ip", "route", "del", "unreachable", f"{master}/32"])


def test_occupied_master_port_names_the_holder_pid(testbed: Testbed, tmp_path: Path) -> None:
    holder = subprocess.Popen(
        testbed.ssh_argv(
            "tb1",
            sys.executable,
            "-c",
            '\'import os,socket,time; s=socket.socket(); s.bind(("",29533)); s.listen();'
            " print(os.getpid(), flush=True); time.sleep(120)'",
        ),
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout is not None
        pid = int(holder.stdout.readline())
        proc, report = _check(testbed, tmp_path, "--master-port", "29533", "--no-smoke-test")
        checks = _by_name(report)
        network = checks["network"]
        assert proc.returncode == 1
        assert network["hosts"]["tb1"]["status"] == "fail"
        assert f"PID {pid}" in network["hosts"]["tb1"]["detail"]
        assert str(pid) in (network["fix_command"] or "")
        assert "29533 is in use" in network["hosts"]["tb1"]["detail"]
        # reachability was still measured, on a stand-in port
        assert network["hosts"]["tb2"]["status"] == "pass"
        assert checks["stale"]["hosts"]["tb1"]["status"] == "warn"
        assert str(pid) in checks["stale"]["hosts"]["tb1"]["detail"]
    finally:
        holder.kill()
        holder.wait()


def test_package_version_mismatch_fails_with_the_version_table(
    testbed: Testbed, tmp_path: Path
) -> None:
    site = f"/srv/corral/site-{tmp_path.name}"
    for host in HOSTS:
        version = "2.0" if host == "tb2" else "1.0"
        meta = f"{site}/tinypkg-{version}.dist-info"
        _on_host(
            testbed,
            host,
            f"mkdir -p {meta} && printf 'Metadata-Version: 2.1\\nName: tinypkg\\n"
            f"Version: {version}\\n' > {meta}/METADATA",
        )
    cluster = tmp_path / "cluster.yaml"
    cluster.write_text(
        "hosts:\n" + "".join(f"  - name: {h}\n    env:\n      PYTHONPATH: {site}\n" for h in HOSTS)
    )
    try:
        proc, report = _check(testbed, tmp_path, "--no-smoke-test", hosts=str(cluster))
        software = _by_name(report)["software"]
        assert proc.returncode == 1
        assert software["status"] == "fail"
        assert software["hosts"]["tb2"]["status"] == "fail"
        assert "tinypkg 2.0 (others 1.0)" in software["hosts"]["tb2"]["detail"]
        assert software["data"]["mismatched"]["tinypkg"] == {
            "tb1": "1.0",
            "tb2": "2.0",
            "tb3": "1.0",
        }
        assert "tinypkg==1.0" in software["fix_command"]
        # the human report shows the table of versions
        text = run_corral(
            "check",
            "--hosts",
            str(cluster),
            "--ssh-config",
            str(testbed.ssh_config),
            "--no-smoke-test",
            cwd=tmp_path,
        )
        assert "versions that differ" in text.stderr and "tinypkg" in text.stderr
    finally:
        for host in HOSTS:
            testbed.run_on(host, ["rm", "-rf", site])


def test_checkpoint_dir_full_or_read_only_is_named(testbed: Testbed, tmp_path: Path) -> None:
    small, ro = f"/srv/corral/small-{tmp_path.name}", f"/srv/corral/ro-{tmp_path.name}"
    _on_host(testbed, "tb2", f"mkdir -p {small} && mount -t tmpfs -o size=1m tmpfs {small}")
    _on_host(testbed, "tb3", f"mkdir -p {ro} && mount -t tmpfs -o size=64m,ro tmpfs {ro}")
    try:
        proc, report = _check(
            testbed, tmp_path, "--no-smoke-test", "--checkpoint-dir", small, "--min-free-gb", "0.5"
        )
        ckpt = _by_name(report)["checkpoint"]
        assert proc.returncode == 1
        assert ckpt["hosts"]["tb2"]["status"] == "fail"
        assert "GiB free" in ckpt["hosts"]["tb2"]["detail"]
        assert {ckpt["hosts"][h]["status"] for h in ("tb1", "tb3")} == {"pass"}
        assert "tb2" in ckpt["error"]

        proc, report = _check(
            testbed, tmp_path, "--no-smoke-test", "--checkpoint-dir", ro, "--min-free-gb", "0"
        )
        ckpt = _by_name(report)["checkpoint"]
        assert ckpt["hosts"]["tb3"]["status"] == "fail"
        assert "cannot write" in ckpt["hosts"]["tb3"]["detail"]
        assert "Read-only" in ckpt["hosts"]["tb3"]["detail"]
    finally:
        testbed.run_on("tb2", ["umount", small])
        testbed.run_on("tb3", ["umount", ro])
        for host in HOSTS:
            testbed.run_on(host, ["rm", "-rf", small, ro])


def test_stale_job_process_is_a_warning_with_its_pid(testbed: Testbed, tmp_path: Path) -> None:
    stale = subprocess.Popen(
        testbed.ssh_argv(
            "tb2", "env", "CORRAL_JOB_ID=old-job-1", "sh", "-c", "'echo $$; exec sleep 120'"
        ),
        stdout=subprocess.PIPE,
        text=True,
    )
    pid = 0
    try:
        assert stale.stdout is not None
        pid = int(stale.stdout.readline())
        proc, report = _check(testbed, tmp_path, "--no-smoke-test")
        check = _by_name(report)["stale"]
        assert proc.returncode == 0  # a warning never blocks
        assert check["status"] == "warn"
        assert check["hosts"]["tb2"]["status"] == "warn"
        assert "old-job-1" in check["hosts"]["tb2"]["detail"]
        assert str(pid) in check["hosts"]["tb2"]["detail"]
        # the fix reaches tb2 the way corral did: with the ssh config given
        assert (
            f"ssh -F {shlex.quote(str(testbed.ssh_config))} tb2 kill {pid}"
            in (check["fix_command"])
        )
        assert check["hosts"]["tb1"]["status"] == "pass"  # tb2's processes are not tb1's
    finally:
        if pid:
            testbed.run_on("tb2", ["kill", str(pid)])  # ssh's end does not take it along
        stale.kill()
        stale.wait()
        deadline = time.monotonic() + 10
        while testbed.pids_on("tb2") and time.monotonic() < deadline:
            time.sleep(0.1)


def test_run_uses_the_detected_interface_of_each_host(
    testbed: Testbed, tmp_path: Path, code_tree: tuple[Path, str], run_dir: Path
) -> None:
    src, dest = code_tree
    proc = run_corral(
        "run",
        "--hosts",
        _hostfile(tmp_path, HOSTS),
        "--ssh-config",
        str(testbed.ssh_config),
        "--workdir",
        dest,
        "--code-dir",
        str(src),
        "--run-dir",
        str(run_dir),
        # the interface is the plan's, whatever the launcher: torchrun imported torch
        # on each host for a standard-library script (issue 30)
        "--launcher",
        "python",
        "--",
        "train.py",
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stderr
    for host in HOSTS:
        assert f"host {host} world 3 iface {testbed.host(host).interface}" in proc.stdout
    assert "pre-flight" in proc.stderr


def test_run_never_calls_its_own_agents_stale(
    testbed: Testbed, tmp_path: Path, code_tree: tuple[Path, str], run_dir: Path
) -> None:
    """The agents `corral run` starts while its checklist runs are the job's own."""
    src, dest = code_tree
    job = f"own-agents-{tmp_path.name}"
    proc = run_corral(
        "run",
        "--hosts",
        _hostfile(tmp_path, HOSTS),
        "--ssh-config",
        str(testbed.ssh_config),
        "--workdir",
        dest,
        "--code-dir",
        str(src),
        "--run-dir",
        str(run_dir),
        "--job-id",
        job,
        "--launcher",
        "python",
        "--",
        "train.py",
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stderr
    assert "pre-flight" in proc.stderr
    # neither as agents of no job (no CORRAL_JOB_ID) nor as this job's (not skipped)
    assert "corral job(s) ?" not in proc.stderr, proc.stderr
    assert f"corral job(s) {job}" not in proc.stderr, proc.stderr
    for host in HOSTS:
        assert f"host {host} world 3" in proc.stdout


def test_missing_script_on_one_host_refuses_the_launch_naming_it(
    testbed: Testbed, tmp_path: Path, code_tree: tuple[Path, str], run_dir: Path
) -> None:
    """No --code-dir (nothing here to compare with): the script must still be there."""
    _, dest = code_tree
    _on_host(testbed, "tb2", f"rm {dest}/train.py")
    config = str(testbed.ssh_config)
    refused = run_corral(
        "run",
        "--hosts",
        _hostfile(tmp_path, HOSTS),
        "--ssh-config",
        config,
        "--workdir",
        dest,
        "--run-dir",
        str(run_dir),
        "--launcher",
        "python",
        "--",
        "train.py",
        cwd=tmp_path,
    )
    assert refused.returncode == 2, refused.stderr
    assert "pre-flight checks failed: code" in refused.stderr
    assert f"the script train.py cannot be run in {dest} on tb2" in refused.stderr
    assert f"{dest}/train.py: not found" in refused.stderr
    assert "tb1" not in refused.stderr.split("cannot be run in", 1)[1].splitlines()[0]
    assert f"corral sync --hosts tb2 . --dest {dest} --ssh-config {shlex.quote(config)}" in (
        refused.stderr
    )
    assert "Traceback" not in refused.stderr and "FileNotFoundError" not in refused.stderr
    assert "host tb" not in refused.stdout  # nothing was launched


def test_unreachable_host_fails_connectivity_fast(healthy_testbed: Testbed, tmp_path: Path) -> None:
    healthy_testbed.kill_sshd("tb2")
    proc, report = _check(healthy_testbed, tmp_path, "--no-smoke-test")
    connectivity = _by_name(report)["connectivity"]
    assert proc.returncode == 1
    assert connectivity["hosts"]["tb2"]["status"] == "fail"
    assert "refused" in connectivity["hosts"]["tb2"]["detail"].lower()
    assert connectivity["hosts"]["tb1"]["status"] == "pass"


def test_run_sync_and_sync_script_semantics(
    testbed: Testbed, tmp_path: Path, code_tree: tuple[Path, str], run_dir: Path
) -> None:
    src, dest = code_tree
    _on_host(testbed, "tb2", f"echo 'LAYERS = 9' > {dest}/pkg/model.py")
    env = {"CORRAL_STATE_DIR": str(tmp_path / "state")}
    common = ["--hosts", _hostfile(tmp_path, HOSTS), "--ssh-config", str(testbed.ssh_config)]
    common += ["--workdir", dest, "--code-dir", str(src), "--run-dir", str(run_dir)]
    common += ["--launcher", "python"]

    failing = tmp_path / "sync.sh"
    failing.write_text("#!/bin/sh\necho pushing to $CORRAL_HOST_NAMES\nexit 3\n")
    refused = run_corral(
        "run", *common, "--sync-script", str(failing), "--", "train.py", cwd=tmp_path, env=env
    )
    assert refused.returncode == 2
    assert "pushing to tb1 tb2 tb3" in refused.stderr
    assert "sync script" in refused.stderr and "exit code 3" in refused.stderr
    assert "host tb" not in refused.stdout

    missing = run_corral(
        "run",
        *common,
        "--no-preflight",
        "--sync-script",
        str(tmp_path / "nope.sh"),
        "--",
        "train.py",
        cwd=tmp_path,
        env=env,
    )
    assert missing.returncode == 0, missing.stderr  # a missing script warns and goes on
    assert "not found" in missing.stderr

    synced = run_corral("run", *common, "--sync", "--", "train.py", cwd=tmp_path, env=env)
    assert synced.returncode == 0, synced.stderr
    assert "3/3 hosts synced" in synced.stderr
    for host in HOSTS:
        assert f"host {host} world 3" in synced.stdout


def test_natural_flow_sync_then_check_and_run_compare_code_by_default(
    testbed: Testbed, tmp_path: Path, run_dir: Path
) -> None:
    """`corral sync . --dest D` then, from the same directory, `corral check
    --workdir D` / `corral run --workdir D`: no --code-dir, the code is compared."""
    src = tmp_path / "proj"
    (src / "pkg").mkdir(parents=True)
    (src / "train.py").write_text("print('TRAINING STARTED', flush=True)\n")
    (src / "pkg" / "model.py").write_text("LAYERS = 4\n")
    dest = f"/srv/corral/natural-{tmp_path.name}"
    env = {"CORRAL_STATE_DIR": str(tmp_path / "state")}
    cluster = ["--hosts", _hostfile(tmp_path, HOSTS), "--ssh-config", str(testbed.ssh_config)]
    try:
        synced = run_corral("sync", *cluster, ".", "--dest", dest, cwd=src, env=env)
        assert synced.returncode == 0, synced.stderr
        _on_host(testbed, "tb2", f"echo 'LAYERS = 5' > {dest}/pkg/model.py")

        checked = run_corral(
            "check", *cluster, "--workdir", dest, "--no-smoke-test", "--json", cwd=src, env=env
        )
        assert checked.returncode == 1, checked.stderr
        report = json.loads(checked.stdout)
        code, sync = _by_name(report)["code"], _by_name(report)["sync"]
        assert code["status"] == "fail" and code["data"]["compared"] is True
        assert code["hosts"]["tb2"]["status"] == "fail"
        assert "pkg/model.py" in code["hosts"]["tb2"]["detail"]
        assert {code["hosts"][h]["status"] for h in ("tb1", "tb3")} == {"pass"}
        assert "tb2" in code["error"]
        # the sync status does not call tb2 "synced": it changed since
        assert sync["hosts"]["tb2"]["status"] == "warn"
        assert "changed on the host" in sync["hosts"]["tb2"]["detail"]
        assert sync["data"]["changed"] == {"tb2": ["pkg/model.py"]}
        assert {sync["hosts"][h]["status"] for h in ("tb1", "tb3")} == {"pass"}
        assert sync["fix_command"].startswith("corral sync --hosts tb2")

        human = run_corral(
            "check", *cluster, "--workdir", dest, "--no-smoke-test", cwd=src, env=env
        )
        rows = [ln for ln in human.stderr.splitlines() if ln.startswith(("✗ code:", "! sync:"))]
        assert len(rows) == 2 and all("tb2" in r for r in rows), human.stderr

        refused = run_corral(
            "run",
            *cluster,
            "--workdir",
            dest,
            "--run-dir",
            str(run_dir),
            "--launcher",
            "python",
            "--",
            "train.py",
            cwd=src,
            env=env,
        )
        assert refused.returncode == 2, refused.stderr
        assert "pre-flight checks failed: code" in refused.stderr
        assert "tb2" in refused.stderr and "pkg/model.py" in refused.stderr
        assert "TRAINING STARTED" not in refused.stdout
    finally:
        for host in HOSTS:
            testbed.run_on(host, ["rm", "-rf", dest])
