"""The shared data path check: the host side (real files, a real shipped session),
the probe over ``local:N`` processes, and the judgement and fix text on synthetic
answers from several machines."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console

from corral.agent.fingerprint import build_manifest
from corral.checks import shared_data, shared_hostside, shared_probe
from corral.checks.context import CheckContext, ChecklistOptions
from corral.checks.render import print_report
from corral.checks.result import ChecklistReport, Status
from corral.checks.shared_probe import SharedProbe, probe_shared
from corral.cluster import load_cluster
from corral.cluster.model import Cluster
from corral.errors import ConfigError
from corral.job.options import CheckPolicy
from corral.job.preflight import checklist_options
from corral.plan.spec import JobSpec
from corral.remote.python import bootstrap_argv, program, stdin_payload
from corral.transport.local import LocalTransport
from corral.transport.options import SshOptions

NAMES = ["n1", "n2", "n3"]
NFS = {"type": "nfs4", "source": "srv:/export", "mount_point": "/data", "root": "/"}
EXT4 = {"type": "ext4", "source": "/dev/sda1", "mount_point": "/", "root": "/"}
MOUNTINFO = (
    "22 1 8:1 / / rw,relatime shared:1 - ext4 /dev/sda1 rw\n"
    "40 22 0:50 / /data rw,relatime shared:7 - nfs4 srv:/export rw,vers=4.2\n"
    "41 22 0:51 /sub /my\\040data rw - nfs srv:/other rw\n"
    "42 40 0:52 / /data/scratch rw - tmpfs tmpfs rw\n"
    "43 40 0:53 / /data/scratch rw - xfs /dev/sdb1 rw\n"
)


# ----------------------------------------------------------------------- option


def test_the_path_must_be_absolute_or_home_relative() -> None:
    assert shared_data.validate_path("/nfs/data") == "/nfs/data"
    assert shared_data.validate_path("~/data") == "~/data"
    assert shared_data.validate_path(None) is None
    for bad, words in (("data", "relative"), ("  ", "empty"), ("/a\nb", "newline")):
        with pytest.raises(ConfigError) as info:
            shared_data.validate_path(bad)
        assert info.value.option == "--shared-data-path" and words in str(info.value)


def test_run_preflight_checks_the_path_of_the_job_spec() -> None:
    cluster = load_cluster(",".join(NAMES))
    args = (CheckPolicy(), cluster, SshOptions(), None, None)
    spec = JobSpec(script="train.py", shared_data_path="/nfs/data")
    assert checklist_options(args[0], spec, *args[1:]).shared_data_path == "/nfs/data"
    assert checklist_options(args[0], JobSpec(script="t.py"), *args[1:]).shared_data_path is None
    with pytest.raises(ConfigError, match="relative"):
        checklist_options(args[0], JobSpec(script="t.py", shared_data_path="rel"), *args[1:])


# ----------------------------------------------------------------------- host side


def test_mountinfo_finds_the_mount_on_top_that_holds_a_path() -> None:
    mounts = shared_hostside.parse_mountinfo(MOUNTINFO)
    assert mounts[2]["mount_point"] == "/my data" and mounts[2]["root"] == "/sub"

    def of(path: str) -> tuple[str, str]:
        found = shared_hostside.mount_of(path, mounts)
        assert found is not None
        return found["type"], found["mount_point"]

    assert of("/data/train") == ("nfs4", "/data")
    assert of("/data") == ("nfs4", "/data")
    assert of("/database") == ("ext4", "/")  # a prefix of the name is not a parent
    assert of("/my data/x") == ("nfs", "/my data")
    assert of("/data/scratch/tmp") == ("xfs", "/data/scratch")  # mounted last: on top


def test_describe_reports_the_filesystem_and_space_or_the_nearest_parent(tmp_path: Path) -> None:
    here = shared_hostside.describe(str(tmp_path))
    assert here["exists"] and here["is_dir"] and "error" not in here
    assert here["fs"]["type"] and here["fs"]["mount_point"]
    assert here["free_bytes"] > 0 and here["total_bytes"] >= here["free_bytes"]
    assert ":" in here["device"] and here["boot_id"]
    gone = shared_hostside.describe(str(tmp_path / "missing" / "deeper"))
    assert not gone["exists"] and gone["realpath"] == str(tmp_path.resolve())
    assert gone["fs"] == here["fs"]
    (tmp_path / "file").write_text("x")
    assert shared_hostside.describe(str(tmp_path / "file"))["error"] == "is not a directory"


def _session(path: Path, requests: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One host session as the coordinator ships it; ``requests`` then EOF."""
    text = program((shared_probe.HOSTSIDE,), f"{shared_probe.HOSTSIDE}:main", {"path": str(path)})
    stdin = stdin_payload(text) + "".join(json.dumps(r) + "\n" for r in requests).encode()
    proc = subprocess.run(
        bootstrap_argv(sys.executable), input=stdin, capture_output=True, timeout=60
    )
    assert proc.returncode == 0, proc.stderr
    return [json.loads(line) for line in proc.stdout.splitlines()]


def test_a_session_writes_reads_and_removes_its_marker_even_without_asking(
    tmp_path: Path,
) -> None:
    write = {"op": "write", "name": ".m1", "content": "token-1"}
    replies = _session(tmp_path, [write, {"op": "read", "name": ".m1"}, {"op": "bogus"}])
    facts, wrote, read, bogus = replies
    assert facts["event"] == "facts" and facts["exists"]
    assert wrote["ok"] and wrote["file"] == str(tmp_path / ".m1")
    assert read == {"event": "read", "found": True, "content": "token-1"}
    assert "unknown op" in bogus["error"]
    assert not (tmp_path / ".m1").exists()  # removed at EOF
    (tmp_path / ".taken").write_text("someone else's")
    taken = _session(tmp_path, [{"op": "write", "name": ".taken", "content": "x"}])[1]
    assert not taken["ok"] and "File exists" in taken["error"]
    assert (tmp_path / ".taken").read_text() == "someone else's"  # never overwritten
    missing = _session(tmp_path, [{"op": "read", "name": ".nope"}, {"op": "remove"}])
    assert missing[1] == {"event": "read", "found": False} and missing[2]["ok"]


# ----------------------------------------------------------------------- probe (local:N)


def _ctx(cluster: Cluster, probe: SharedProbe | None) -> CheckContext:
    return CheckContext(
        options=ChecklistOptions(cluster=cluster, shared_data_path=probe.path if probe else None),
        cluster=cluster,
        master=cluster.hosts[0],
        master_addr=cluster.hosts[0].name,
        workdir="/w",
        facts={},
        shared_data=probe,
    )


def test_local_nodes_share_this_machine(tmp_path: Path) -> None:
    cluster = load_cluster("local:3")
    probe = asyncio.run(probe_shared(LocalTransport(), cluster, str(tmp_path)))
    assert probe.writer == cluster.hosts[0].name and not probe.stuck and not probe.unreachable
    assert set(probe.reads) == {h.name for h in cluster.hosts}
    assert list(tmp_path.iterdir()) == []  # the marker is gone
    result = shared_data.check(_ctx(cluster, probe))
    assert result.status is Status.PASS, result
    assert "local:N nodes share this machine" in result.summary
    missing = asyncio.run(probe_shared(LocalTransport(), cluster, str(tmp_path / "no")))
    result = shared_data.check(_ctx(cluster, missing))
    assert result.status is Status.FAIL
    assert result.error == f"{tmp_path / 'no'} does not exist on any host"
    assert result.fix_command == f"mkdir -p {tmp_path / 'no'}"


def test_the_marker_is_never_code(tmp_path: Path) -> None:
    """A shared data path inside the code tree: the hosts hash the tree while the
    marker is there on some of them, so the code check must not see it."""
    (tmp_path / "train.py").write_text("print()\n")
    before = build_manifest(str(tmp_path)).to_json()
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / shared_probe.new_probe("/x").marker).write_text("c")
    assert build_manifest(str(tmp_path)).to_json() == before


def test_a_host_that_never_answers_fails_as_a_hung_mount(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    hang = tmp_path / "python-that-hangs"
    hang.write_text("#!/bin/sh\nexec sleep 60\n")
    hang.chmod(0o755)
    monkeypatch.setattr(shared_probe, "SESSION_TIMEOUT", 0.5)
    cluster = load_cluster("local:2")
    probe = asyncio.run(probe_shared(LocalTransport(), cluster, str(tmp_path), str(hang)))
    assert probe.writer is None and set(probe.stuck) == {"local-0", "local-1"}
    result = shared_data.check(_ctx(cluster, probe))
    assert result.status is Status.FAIL
    assert "no answer within 0.5 s" in result.hosts["local-0"].detail
    assert "hung network mount" in result.hosts["local-0"].detail


# ----------------------------------------------------------------------- judgement


def _facts(
    fs: dict[str, str] | None = None,
    *,
    exists: bool = True,
    boot: str = "boot-a",
    device: str = "0:50",
) -> dict[str, Any]:
    return {
        "event": "facts",
        "path": "/data",
        "exists": exists,
        "is_dir": exists,
        "fs": dict(fs or NFS),
        "device": device,
        "free_bytes": 500 << 30,
        "total_bytes": 1000 << 30,
        "boot_id": boot,
    }


def _probe(facts: dict[str, dict[str, Any]], **kw: Any) -> SharedProbe:
    probe = SharedProbe(path="/data", marker=".corral-shared-check-x", content="c", facts=facts)
    for key, value in kw.items():
        setattr(probe, key, value)
    return probe


def _judge(probe: SharedProbe) -> Any:
    return shared_data.check(_ctx(load_cluster(",".join(NAMES)), probe))


SEEN = {"event": "read", "found": True, "content": "c"}
UNSEEN = {"event": "read", "found": False}


def test_every_host_seeing_the_marker_passes_with_type_and_space() -> None:
    facts = {n: _facts(boot=f"boot-{n}") for n in NAMES}
    result = _judge(_probe(facts, writer="n1", reads={"n2": SEEN, "n3": SEEN}))
    assert result.status is Status.PASS and result.fix_command is None
    assert (
        result.hosts["n1"].detail == "wrote the marker; nfs4 srv:/export on /data, 500.0 GiB free"
    )
    assert result.hosts["n2"].detail.startswith("sees the marker from n1; nfs4 srv:/export")
    assert result.summary.startswith("/data: every host sees one marker (nfs4 srv:/export")
    assert result.data["hosts"]["n3"]["fs_type"] == "nfs4"
    assert result.data["hosts"]["n3"]["sees_marker"] and result.data["writer"] == "n1"


def test_a_host_on_another_filesystem_fails_with_the_writers_mount_command() -> None:
    facts = {n: _facts(boot=f"boot-{n}") for n in NAMES}
    facts["n2"] = _facts(EXT4, boot="boot-n2", device="8:1")
    result = _judge(_probe(facts, writer="n1", reads={"n2": UNSEEN, "n3": SEEN}))
    assert result.status is Status.FAIL
    assert result.hosts_with(Status.FAIL) == ["n2"]
    assert result.hosts["n2"].detail == (
        "does not see the marker from n1: a different filesystem here: ext4 /dev/sda1 on /"
    )  # device numbers of different machines are not compared
    assert result.error == (
        "n2 does not see the marker written in /data from n1 (nfs4 srv:/export on /data)"
    )
    assert result.fix_command == (
        "ssh n2 'sudo mkdir -p /data && sudo mount -t nfs4 srv:/export /data'"
    )
    assert not result.data["hosts"]["n2"]["sees_marker"]


def test_a_missing_path_fails_naming_the_host_with_mkdir_and_mount() -> None:
    facts = {n: _facts(boot=f"boot-{n}") for n in NAMES}
    facts["n3"] = _facts(EXT4, exists=False, boot="boot-n3")
    result = _judge(_probe(facts, writer="n1", reads={"n2": SEEN}))
    assert result.hosts_with(Status.FAIL) == ["n3"]
    assert result.error == "/data does not exist on n3"
    assert result.fix_command == (
        "ssh n3 'sudo mkdir -p /data && sudo mount -t nfs4 srv:/export /data'"
    )


def test_missing_everywhere_on_several_machines_asks_for_a_shared_export() -> None:
    facts = {n: _facts(EXT4, exists=False, boot=f"boot-{n}") for n in NAMES}
    result = _judge(_probe(facts))
    assert result.error == "/data does not exist on any host"
    fix = result.fix_command
    assert fix.startswith(
        "/data is on no host yet: mount the shared export (SERVER:/export) at /data on n1, n2, n3: "
    )
    assert "ssh n3 'sudo mkdir -p /data && sudo mount -t nfs SERVER:/export /data'" in fix


def test_missing_everywhere_on_one_machine_is_a_mkdir() -> None:
    facts = {n: _facts(EXT4, exists=False, boot="same") for n in NAMES}
    assert _judge(_probe(facts)).fix_command == "mkdir -p /data"


def test_local_disks_of_several_machines_fail_and_the_fix_includes_the_writer() -> None:
    facts = {n: _facts(EXT4, boot=f"boot-{n}", device="8:1") for n in NAMES}
    result = _judge(_probe(facts, writer="n1", reads={"n2": UNSEEN, "n3": UNSEEN}))
    assert result.hosts_with(Status.FAIL) == ["n2", "n3"]
    assert result.hosts["n2"].detail == (
        "does not see the marker from n1: another directory here, on ext4 /dev/sda1 on / "
        "like n1's: a local copy"
    )
    assert result.error.startswith("n2, n3 do not see the marker written in /data from n1")
    assert result.fix_command.startswith(
        "/data on n1 is a local ext4 disk, not shared: mount the shared export "
        "(SERVER:/export) at /data on n1, n2, n3: ssh n1 "
    )


def test_one_machine_names_the_devices_and_mounts_only_the_failing_hosts() -> None:
    facts = {n: _facts(EXT4, boot="same", device="8:1") for n in NAMES}
    facts["n3"] = _facts(EXT4, boot="same", device="8:2")
    result = _judge(_probe(facts, writer="n1", reads={"n2": SEEN, "n3": UNSEEN}))
    assert result.hosts["n2"].status is Status.PASS  # no local-filesystem warning
    assert "a different filesystem here (device 8:2, n1's 8:1)" in result.hosts["n3"].detail
    assert result.fix_command == (
        "mount the shared export (SERVER:/export) at /data on n3: "
        "ssh n3 'sudo mkdir -p /data && sudo mount -t nfs SERVER:/export /data'"
    )


def test_a_local_filesystem_seen_across_machines_warns() -> None:
    facts = {n: _facts(EXT4, boot=f"boot-{n}") for n in NAMES}
    result = _judge(_probe(facts, writer="n1", reads={"n2": SEEN, "n3": SEEN}))
    assert result.status is Status.WARN
    assert "on ext4, a local filesystem" in result.hosts["n2"].detail
    unknown_boot = {n: _facts(EXT4, boot="") for n in NAMES}
    for f in unknown_boot.values():
        f["boot_id"] = None  # not Linux: the hosts cannot be shown to be one machine
    warned = _judge(_probe(unknown_boot, writer="n1", reads={"n2": SEEN, "n3": SEEN}))
    assert warned.status is Status.WARN


def test_read_only_everywhere_warns_without_a_fix() -> None:
    facts = {n: _facts(boot=f"boot-{n}") for n in NAMES}
    errors = {n: "cannot write in /data: Read-only file system" for n in NAMES}
    result = _judge(_probe(facts, write_errors=errors))
    assert result.status is Status.WARN and result.fix_command is None
    assert "cannot write a marker in /data on any host" in (result.warning or "")
    assert "Read-only file system" in result.hosts["n2"].detail


def test_hung_unreachable_unreadable_and_unremoved() -> None:
    facts = {n: _facts(boot=f"boot-{n}") for n in ("n1", "n2")}
    probe = _probe(
        facts,
        writer="n1",
        reads={"n2": {"event": "read", "found": False, "error": "Stale file handle"}},
        unreachable={"n3": "connection refused"},
        remove_error="/data/.m: Permission denied",
    )
    result = _judge(probe)
    assert result.hosts["n3"].status is Status.SKIP
    assert result.hosts["n3"].detail == "host did not answer: connection refused"
    assert result.hosts["n2"].detail == "cannot read the marker from n1: Stale file handle"
    assert result.error == "n2: cannot read the marker from n1: Stale file handle"
    assert result.hosts["n1"].status is Status.WARN
    assert "could not remove the marker" in result.hosts["n1"].detail
    stuck = _judge(_probe(facts, writer="n1", reads={}, stuck={"n2": "no answer within 15 s"}))
    assert stuck.hosts["n2"].status is Status.FAIL
    assert "is /data on a hung network mount?" in stuck.hosts["n2"].detail


def test_without_a_path_the_check_is_skipped_and_the_report_renders_the_fix() -> None:
    cluster = load_cluster(",".join(NAMES))
    assert shared_data.check(_ctx(cluster, None)).status is Status.SKIP
    facts = {n: _facts(boot=f"boot-{n}") for n in NAMES}
    facts["n2"] = _facts(EXT4, boot="boot-n2")
    result = _judge(_probe(facts, writer="n1", reads={"n2": UNSEEN, "n3": SEEN}))
    console = Console(record=True, width=300, color_system=None)
    print_report(console, ChecklistReport(checks=[result], hosts=NAMES))
    text = console.export_text()
    assert "✗ shared_data: fail  n2" in text
    assert "fix: ssh n2 'sudo mkdir -p /data && sudo mount -t nfs4 srv:/export /data'" in text
