"""The check modules are pure over gathered facts: each judged on synthetic facts."""

from __future__ import annotations

import copy
import os
from pathlib import Path
from typing import Any

import pytest

from corral.agent.fingerprint import build_manifest
from corral.checks import (
    checkpoint,
    clock,
    connectivity,
    consistency,
    hardware,
    network,
    software,
    stale,
    sync_status,
)
from corral.checks.context import CheckContext, ChecklistOptions, ssh_command
from corral.checks.gather import HostFacts
from corral.checks.reference import CodeReference, corresponds, resolve
from corral.checks.render import print_report
from corral.checks.result import ChecklistReport, CheckResult, HostCheck, Status
from corral.checks.runner import _exclude
from corral.cluster import load_cluster
from corral.cluster.model import Cluster
from corral.sync.state import record_sync
from corral.transport.options import SshOptions

NAMES = ["n1", "n2", "n3"]
BASE: dict[str, Any] = {
    "software": {
        "python": "3.11.7",
        "python_executable": "/usr/bin/python3",
        "torch": "2.13.0+cpu",
        "cuda": None,
        "nccl": None,
        "mlx": None,
        "corral": "0.1.0",
        "corral_importable": True,
        "binaries": {"torchrun": "/usr/bin/torchrun"},
    },
    "packages": {"torch": "2.13.0+cpu", "numpy": "2.1.0", "pip": "24.0", "corral": "0.1.0"},
    "hardware": {
        "gpus": [],
        "rdma": [],
        "cpus": 8,
        "memory": {"total": 32 << 30, "available": 20 << 30},
    },
    "code": {},
    "stale": [],
    "gpu_processes": [],
    "listener": None,
    "route": {"addr": "10.0.0.1", "ip": "10.0.0.1", "source": None, "interface": "eth0"},
}


def _cluster(slots: int = 1) -> Cluster:
    return load_cluster(",".join(f"{n}:{slots}" for n in NAMES))


def _ctx(
    per_host: dict[str, dict[str, Any]] | None = None,
    *,
    errors: dict[str, str] | None = None,
    cluster: Cluster | None = None,
    **options: Any,
) -> CheckContext:
    cluster = cluster or _cluster()
    facts = {}
    for i, host in enumerate(cluster.hosts):
        data = copy.deepcopy(BASE)
        data["route"]["source"] = f"10.0.0.{i + 1}"
        for key, value in (per_host or {}).get(host.name, {}).items():
            if isinstance(value, dict) and isinstance(data.get(key), dict):
                data[key].update(value)
            else:
                data[key] = value
        error = (errors or {}).get(host.name)
        facts[host.name] = HostFacts(
            host=host,
            facts={} if error else data,
            error=error,
            rtt_ms=0.5,
            clock_offset_s=0.0,
            connect={"ok": True, "ms": 0.3},
        )
    opts = ChecklistOptions(cluster=cluster, **options)
    return CheckContext(
        options=opts,
        cluster=cluster,
        master=cluster.hosts[0],
        master_addr="10.0.0.1",
        workdir="/srv/code",
        facts=facts,
    )


def test_from_hosts_takes_the_worst_and_names_hosts() -> None:
    result = CheckResult.from_hosts(
        "x",
        {
            "a": HostCheck(Status.PASS),
            "b": HostCheck(Status.FAIL, "broken"),
            "c": HostCheck(Status.SKIP),
        },
        fix_command="fix it",
    )
    assert result.status is Status.FAIL
    assert result.error == "b: broken" and result.fix_command == "fix it"
    assert CheckResult.from_hosts("y", {"a": HostCheck(Status.SKIP)}).status is Status.SKIP
    passed = CheckResult.from_hosts("z", {"a": HostCheck(Status.PASS)}, fix_command="unused")
    assert passed.fix_command is None and passed.error is None
    report = ChecklistReport(
        checks=[passed, CheckResult.from_hosts("s", {"a": HostCheck(Status.SKIP)})], hosts=["a"]
    )
    assert report.overall_status is Status.PASS
    doc = report.to_json()
    assert doc["overall_status"] == "pass" and doc["block_on_failure"] is True
    assert doc["checks"][0]["hosts"]["a"] == {"status": "pass", "detail": ""}


def test_connectivity_names_unreachable_host() -> None:
    result = connectivity.check(_ctx(errors={"n2": "n2: connection refused"}))
    assert result.status is Status.FAIL
    assert result.hosts["n2"].status is Status.FAIL and "refused" in result.hosts["n2"].detail
    assert result.hosts["n1"].status is Status.PASS and "RTT" in result.hosts["n1"].detail
    assert result.fix_command is not None and "ssh -v n2" in result.fix_command


def test_software_mismatch_fails_the_minority_with_a_table() -> None:
    ctx = _ctx(
        {
            "n3": {"software": {"torch": "2.12.0"}, "packages": {"torch": "2.12.0", "pip": "23"}},
            "n2": {"packages": {"numpy": "1.26.4"}},
        }
    )
    result = software.check(ctx)
    assert result.status is Status.FAIL
    assert result.hosts["n1"].status is Status.PASS
    assert "torch 2.12.0 (others 2.13.0+cpu)" in result.hosts["n3"].detail
    assert "numpy 1.26.4 (others 2.1.0)" in result.hosts["n2"].detail
    assert result.data["mismatched"]["torch"] == {
        "n1": "2.13.0+cpu",
        "n2": "2.13.0+cpu",
        "n3": "2.12.0",
    }
    assert "pip" not in result.data["mismatched"]  # packaging tools may differ
    assert result.fix_command is not None and "numpy==2.1.0" in result.fix_command


def test_software_missing_corral_and_torch_fail() -> None:
    ctx = _ctx({"n2": {"software": {"corral_importable": False, "torch": None}}})
    result = software.check(ctx)
    detail = result.hosts["n2"].detail
    assert result.hosts["n2"].status is Status.FAIL
    assert "corral is not installed" in detail and "torch is not installed" in detail
    assert (
        software.check(_ctx({"n2": {"software": {"torch": None}}}, launcher="python"))
        .hosts["n2"]
        .detail.startswith("differs")
    )  # python launcher: torch only has to agree


@pytest.mark.parametrize(
    ("backend", "shared"),
    [("nccl", Status.FAIL), (None, Status.WARN), ("gloo", Status.PASS)],
)
def test_hardware_gpus_against_ranks_and_rdma(backend: str | None, shared: Status) -> None:
    gpus = [{"name": "A100", "memory_mib": 81920}] * 4
    ctx = _ctx(
        {
            "n1": {"hardware": {"gpus": gpus, "rdma": ["mlx5_0"]}},
            "n2": {"hardware": {"gpus": gpus[:2], "rdma": ["mlx5_0"]}},
            "n3": {"hardware": {"gpus": gpus}},
        },
        cluster=_cluster(slots=4),
        backend=backend,
    )
    result = hardware.check(ctx)
    assert (
        result.hosts["n1"].status is Status.PASS and "4x A100 80 GiB" in result.hosts["n1"].detail
    )
    # ranks sharing a GPU: fatal only for NCCL (gloo/CPU ranks may share one)
    n2 = result.hosts["n2"]
    assert n2.status is shared
    assert n2.detail.startswith("4 ranks but 2 GPU(s): ")
    assert ("NCCL" in n2.detail) is (backend != "gloo")
    assert result.hosts["n3"].status is Status.WARN and "RDMA" in result.hosts["n3"].detail
    assert result.fix_command is not None and "NCCL_IB_DISABLE=1" in result.fix_command
    cpu = hardware.check(_ctx())
    assert cpu.status is Status.PASS and cpu.summary.startswith("CPU only")


def test_consistency_names_divergent_files_and_honours_threshold(tmp_path: Path) -> None:
    (tmp_path / "a.py").write_text("1")
    (tmp_path / "b.py").write_text("2")
    ref = build_manifest(str(tmp_path))
    same = ref.to_json()
    changed = dict(same, files={"a.py": ref.files["a.py"], "b.py": "0" * 64, "c.py": "1" * 64})
    changed["digest"] = "different"
    per_host = {
        "n1": {"code": {"tree": same}},
        "n2": {"code": {"tree": same}},
        "n3": {"code": {"tree": changed}},
    }
    ctx = _ctx(per_host)
    ctx.local_manifest = ref
    result = consistency.check(ctx)
    assert result.status is Status.FAIL
    assert result.data["ratio"] == pytest.approx(2 / 3)
    assert "changed b.py" in result.hosts["n3"].detail and "extra c.py" in result.hosts["n3"].detail
    assert result.error is not None and "n3" in result.error
    assert result.fix_command is not None and result.fix_command.startswith(
        "corral sync --hosts n3"
    )

    lenient = _ctx(per_host, consistency_threshold=0.6)
    lenient.local_manifest = ref
    assert consistency.check(lenient).status is Status.WARN

    missing = _ctx({**per_host, "n3": {"code": {"tree": {"root": "/srv/code", "missing": True}}}})
    missing.local_manifest = ref
    assert "no code directory /srv/code" in consistency.check(missing).hosts["n3"].detail


def test_exclude_divergent_drops_hosts_but_never_the_master() -> None:
    ctx = _ctx()
    code = CheckResult.from_hosts(
        "code",
        {
            "n1": HostCheck(Status.PASS),
            "n2": HostCheck(Status.PASS),
            "n3": HostCheck(Status.FAIL, "x"),
        },
        data={"divergent": {"n3": {"changed": ["x"]}}},
    )
    assert _exclude(ctx, code) == ["n3"]
    assert [h.name for h in ctx.cluster.hosts] == ["n1", "n2"]
    assert code.status is Status.WARN and code.warning is not None and "n3 left out" in code.warning

    ctx = _ctx()
    master_code = CheckResult.from_hosts(
        "code", {"n1": HostCheck(Status.FAIL, "x")}, data={"divergent": {"n1": {}}}
    )
    assert _exclude(ctx, master_code) == []
    assert master_code.error is not None and "master host" in master_code.error


def test_network_failures_are_named() -> None:
    listener = {
        "requested": 29500,
        "free": False,
        "port": 41000,
        "error": "Address already in use",
        "holders": [{"pid": 4242, "cmdline": "python old_train.py"}],
    }
    ctx = _ctx(
        {
            "n1": {"listener": listener},
            "n2": {"route": {"ip": "127.0.1.1"}},
        }
    )
    ctx.facts["n3"].connect = {"ok": False, "error": "Connection timed out"}
    result = network.check(ctx)
    assert result.status is Status.FAIL
    assert "PID 4242" in result.hosts["n1"].detail and "in use" in result.hosts["n1"].detail
    assert "resolves to 127.0.1.1" in result.hosts["n2"].detail
    assert "cannot reach 10.0.0.1:41000" in result.hosts["n3"].detail
    assert result.fix_command is not None and "kill 4242" in result.fix_command
    assert network.interfaces(ctx) == {"n1": "eth0", "n2": "eth0", "n3": "eth0"}


def test_network_loopback_master_and_missing_interface() -> None:
    ctx = _ctx()
    ctx.master_addr = "127.0.0.1"
    result = network.check(ctx)
    assert result.status is Status.FAIL and "loopback" in (result.error or "")

    ctx = _ctx({"n2": {"route": {"interfaces": {"eth0": "10.0.0.2", "lo": "127.0.0.1"}}}})
    ctx.options.gloo_interface = "ib0"
    result = network.check(ctx)
    assert "interface ib0 does not exist there (has eth0, lo)" in result.hosts["n2"].detail


def test_network_line_with_master_port_0_names_the_tested_port_not_0() -> None:
    listener = {"requested": 0, "free": True, "port": 41234}
    ctx = _ctx({"n1": {"listener": listener}}, master_port=0)
    ctx.facts["n2"].connect = {"ok": False, "error": "Connection refused"}
    result = network.check(ctx)
    assert ":0" not in (result.summary or "") and ":0 " not in (result.fix_command or "")
    assert "port 41234" in (result.fix_command or "")
    ctx.facts["n2"].connect = {"ok": True, "ms": 0.3}
    result = network.check(ctx)
    assert result.status is Status.PASS
    assert result.summary == (
        "all hosts reach 10.0.0.1 (tested on free port 41234; "
        "--master-port 0: the job's is picked at launch)"
    )
    assert "reaches 10.0.0.1:41234" in result.hosts["n2"].detail
    ctx = _ctx({"n1": {"listener": {"requested": 29400, "free": True, "port": 29400}}})
    ctx.options.master_port = 29400
    assert network.check(ctx).summary == "all hosts reach 10.0.0.1:29400"


def test_clock_skew_warns() -> None:
    ctx = _ctx()
    ctx.facts["n2"].clock_offset_s = 2.5
    result = clock.check(ctx)
    assert result.status is Status.WARN and result.hosts["n2"].status is Status.WARN
    assert "+2.500 s" in result.hosts["n2"].detail
    assert clock.check(_ctx()).status is Status.PASS


def test_checkpoint_space_and_errors() -> None:
    assert checkpoint.check(_ctx()).status is Status.SKIP
    ok = {"path": "/ck", "existed": True, "writable": True, "free_bytes": 50 << 30}
    ctx = _ctx(
        {
            "n1": {"checkpoint": ok},
            "n2": {"checkpoint": dict(ok, free_bytes=1 << 20)},
            "n3": {
                "checkpoint": {"path": "/ck", "error": "cannot write in /ck: Read-only file system"}
            },
        },
        checkpoint_dir="/ck",
        min_free_gb=1.0,
    )
    result = checkpoint.check(ctx)
    assert result.hosts["n1"].status is Status.PASS
    assert result.hosts["n2"].status is Status.FAIL and "need 1 GiB" in result.hosts["n2"].detail
    assert "Read-only" in result.hosts["n3"].detail
    assert result.error is not None and "n2" in result.error and "n3" in result.error


def test_stale_processes_warn_with_kill_command() -> None:
    ctx = _ctx({"n2": {"stale": [{"pid": 77, "job": "old", "cmdline": "python -m corral.agent"}]}})
    result = stale.check(ctx)
    assert result.status is Status.WARN
    assert "corral job(s) old: 77" in result.hosts["n2"].detail
    assert result.fix_command == "ssh n2 kill 77"


def test_another_installations_leftovers_are_named_once_and_never_killed() -> None:
    """A shared box: leftovers under another run dir are that installation's."""
    cluster = load_cluster("local:2")
    theirs = {
        "pid": 77, "job": "theirs", "cmdline": "sleep",
        "node_dir": "/srv/other/runs/theirs/nodes/local-0",
    }  # fmt: skip
    mine = {"pid": 78, "job": "old", "cmdline": "sleep", "node_dir": "/srv/me/runs/old/nodes/l1"}
    shared = {"process_scope": "box net:[1]", "stale": [theirs, mine]}
    ctx = _ctx(
        {h.name: dict(shared) for h in cluster.hosts}, cluster=cluster, run_dir="/srv/me/runs"
    )
    result = stale.check(ctx)
    assert result.fix_command == "kill 78"  # only this installation's own leftover
    said = "1 process(es) of another corral installation's job(s) theirs (run dir /srv/other/runs)"
    details = " ".join(h.detail for h in result.hosts.values())
    assert details.count(said) == 1 and "77" not in result.fix_command
    assert said in result.summary

    alone = {"process_scope": "box net:[1]", "stale": [theirs]}
    ctx = _ctx(
        {h.name: dict(alone) for h in cluster.hosts}, cluster=cluster, run_dir="/srv/me/runs"
    )
    result = stale.check(ctx)
    assert result.status is Status.PASS and result.fix_command is None  # information, no kill
    assert said in result.hosts["local-0"].detail
    # without a run dir to compare (corral check), a leftover is stale as before
    ctx = _ctx({h.name: dict(alone) for h in cluster.hosts}, cluster=cluster)
    assert stale.check(ctx).fix_command == "kill 77"


def _proc(pid: int, job: str | None, *, anchor: bool = False, **more: Any) -> dict[str, Any]:
    return {"pid": pid, "job": job, "cmdline": f"cmd {pid}", "anchor": anchor, **more}


def test_only_processes_of_a_job_without_a_live_agent_are_stale() -> None:
    from corral.agent.hostfacts import classify

    procs = [
        _proc(10, None, anchor=True),  # a local agent: no job id of its own
        _proc(11, "live", under=10),  # its ranks
        _proc(12, "live", under=11),  # a rank's child (torchrun's worker)
        _proc(13, "live"),  # a rank's daemon that left the tree: still the running job's
        _proc(20, "dead"),  # an orphan of a job whose agent is gone
        _proc(21, None),
        _proc(30, "slurm-7", under=4),  # under slurmstepd (PID 4): running
        _proc(20, "dead"),  # listed twice: named once
    ]
    stale_procs, busy = classify(procs)
    assert stale_procs == [
        {"pid": 20, "job": "dead", "cmdline": "cmd 20"},
        {"pid": 21, "job": None, "cmdline": "cmd 21"},
    ]
    assert busy == [{"job": "live", "pids": [10, 11, 12, 13]}, {"job": "slurm-7", "pids": [30]}]


def test_anchor_is_the_agent_or_an_actor_worker_not_a_rank_wrapper() -> None:
    from corral.agent.hostfacts import is_anchor

    assert is_anchor(b"/usr/bin/python3\0-m\0corral.agent\0")
    assert is_anchor(b"python\0-m\0corral.actors.worker\0")
    assert not is_anchor(b"python\0-m\0corral.agent.worker\0train.py\0")
    assert not is_anchor(b"sh\0-c\0exec python3 -m corral.agent\0")


def test_a_running_job_is_busy_never_stale_and_never_killed() -> None:
    busy = [{"job": "other-run", "pids": [501, 502]}]
    gpu = [{"pid": 502, "cmdline": "python", "memory_mib": "900"}]
    ctx = _ctx({"n2": {"busy": busy, "gpu_processes": gpu}, "n3": {"busy": busy}})
    result = stale.check(ctx)
    assert result.fix_command is None
    # holding a GPU: a warning naming the job, no kill
    assert result.hosts["n2"].status is Status.WARN
    assert "GPU in use by PID 502 (job other-run, running)" in result.hosts["n2"].detail
    assert "busy: job other-run is running here" in result.hosts["n2"].detail
    assert "stale" not in result.hosts["n2"].detail and "ended" not in result.hosts["n2"].detail
    # only running: information
    assert result.hosts["n3"].status is Status.PASS
    assert result.hosts["n3"].detail == "busy: job other-run is running here (2 process(es))"
    assert "busy: job other-run is running on n2" in result.summary


def test_hosts_on_one_machine_name_each_pid_once() -> None:
    shared = {
        "process_scope": "box net:[4026531840]",
        "stale": [{"pid": 77, "job": "old", "cmdline": "sleep"}],
        "busy": [{"job": "other-run", "pids": [501, 502]}],
    }
    ctx = _ctx({n: dict(shared) for n in NAMES})
    result = stale.check(ctx)
    text = " ".join(h.detail for h in result.hosts.values())
    assert text.count("77") == 1 and text.count("other-run") == 1
    assert result.hosts["n1"].status is Status.WARN
    assert result.hosts["n2"].detail == result.hosts["n3"].detail == "same machine as n1"
    assert result.fix_command == "ssh n1 kill 77"


def test_console_report_shows_table_problems_and_fixes() -> None:
    from rich.console import Console

    ctx = _ctx({"n3": {"software": {"torch": "2.12.0"}, "packages": {"torch": "2.12.0"}}})
    report = ChecklistReport(checks=[software.check(ctx), clock.check(ctx)], hosts=NAMES)
    console = Console(record=True, width=200)
    print_report(console, report)
    text = console.export_text()
    assert "pre-flight checklist" in text and "versions that differ" in text
    assert "✗ software:" in text and "fix:" in text
    assert "1 passed, 0 warned, 1 failed" in text


# --------------------------------------------------------------------------- default reference


def _ssh_opts(**kw: Any) -> ChecklistOptions:
    return ChecklistOptions(cluster=_cluster(), **kw)


def test_reference_is_here_when_workdir_corresponds(tmp_path: Path) -> None:
    home = tmp_path / "home"
    proj = home / "proj"
    proj.mkdir(parents=True)
    state = tmp_path / "state.json"
    for workdir in (None, str(proj), str(proj) + "/", "~/proj", "proj"):
        ref = resolve(
            _ssh_opts(workdir=workdir, script="train.py"),
            cwd=str(proj),
            home=str(home),
            state=state,
        )
        assert ref.code_dir == str(proj), workdir
        assert ref.script == str(proj / "train.py")
    assert corresponds("/srv/code", "/srv/code") and not corresponds("/srv/code", str(proj))
    assert not corresponds("~other/proj", str(proj), str(home))
    assert (
        resolve(ChecklistOptions(cluster=load_cluster("local:2")), cwd=str(proj)).code_dir is None
    )


def test_reference_from_the_sync_record_or_a_clear_reason(tmp_path: Path) -> None:
    here, other = tmp_path / "here", tmp_path / "other"
    here.mkdir()
    other.mkdir()
    state = tmp_path / "state.json"
    opts = _ssh_opts(workdir="/srv/code")
    none = resolve(opts, cwd=str(here), state=state)
    assert none.code_dir is None and none.why_not is not None
    assert "--code-dir" in none.why_not and "corral sync . --dest /srv/code" in none.why_not
    assert str(here) in none.why_not

    record_sync("n2", "/srv/code/", digest="d", src=str(other), files=1, when=1.0, path=state)
    elsewhere = resolve(opts, cwd=str(here), state=state)
    assert elsewhere.code_dir is None and elsewhere.why_not is not None
    assert f"--code-dir {other}" in elsewhere.why_not

    record_sync("n3", "/srv/code", digest="d", src=str(here), files=1, when=2.0, path=state)
    synced = resolve(_ssh_opts(workdir="/srv/code", script="t.py"), cwd=str(here), state=state)
    assert synced.code_dir == str(here) and synced.script == str(here / "t.py")
    assert synced.synced is not None and "corral sync pushed it" in synced.how

    missing = resolve(_ssh_opts(code_dir=str(tmp_path / "nope")), cwd=str(here), state=state)
    assert missing.code_dir is None and missing.why_not is not None
    assert "--code-dir" in missing.why_not and "not a directory" in missing.why_not


def test_consistency_says_why_it_cannot_compare() -> None:
    ctx = _ctx()
    why = "cannot compare: this directory (/x) is not --workdir /srv/code; pass --code-dir DIR"
    ctx.reference = CodeReference(None, why_not=why)
    result = consistency.check(ctx)
    assert result.status is Status.WARN
    assert result.warning == why and result.fix_command == "pass --code-dir DIR"
    assert {c.status for c in result.hosts.values()} == {Status.WARN}
    assert result.data["compared"] is False


def test_sync_status_names_a_host_changed_since_the_sync(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CORRAL_STATE_DIR", str(tmp_path / "state"))
    (tmp_path / "code").mkdir()
    (tmp_path / "code" / "a.py").write_text("1")
    (tmp_path / "code" / "b.py").write_text("2")
    ref = build_manifest(str(tmp_path / "code"))
    for name in NAMES:
        record_sync(name, "/srv/code", digest=ref.digest, src=ref.root, files=2, manifest=ref.files)
    tampered = dict(ref.to_json(), files={**ref.files, "b.py": "0" * 64})
    ctx = _ctx({"n1": {"code": {"tree": ref.to_json()}}, "n3": {"code": {"tree": tampered}}})
    ctx.local_manifest = ref
    result = sync_status.check(ctx)
    assert result.status is Status.WARN
    assert result.hosts["n1"].status is Status.PASS and "verified" in result.hosts["n1"].detail
    assert result.hosts["n2"].status is Status.PASS and "verified" not in result.hosts["n2"].detail
    assert result.hosts["n3"].status is Status.WARN and "b.py" in result.hosts["n3"].detail
    assert "changed on the host" in result.hosts["n3"].detail
    assert result.data["changed"] == {"n3": ["b.py"]}
    assert result.warning is not None and "n3 (b.py)" in result.warning
    assert result.fix_command is not None and result.fix_command.startswith(
        "corral sync --hosts n3"
    )


# --------------------------------------------------------------------------- console report


def _sixteen() -> ChecklistReport:
    hosts = [f"gpu{i:02d}" for i in range(1, 17)]
    code = CheckResult.from_hosts(
        "code",
        {
            h: HostCheck(Status.FAIL, "changed pkg/model.py")
            if h in ("gpu03", "gpu11")
            else HostCheck(Status.PASS, "12 files match")
            for h in hosts
        },
        error="code differs on gpu03, gpu11 (consistency 0.88, threshold 1.00)",
        fix_command="corral sync --hosts gpu03,gpu11 /home/me/a-rather-long-project-path "
        "--dest /srv/a-rather-long-destination-path --ssh-config /etc/corral/ssh_config",
    )
    stale_check = CheckResult.from_hosts(
        "stale",
        {h: HostCheck(Status.WARN if h >= "gpu10" else Status.PASS, "PID 7") for h in hosts},
        fix_command="ssh gpu10 kill 7",
    )
    ok = CheckResult.from_hosts("clock", {h: HostCheck(Status.PASS, "0.1 ms") for h in hosts})
    return ChecklistReport(checks=[ok, code, stale_check], hosts=hosts)


def test_report_is_one_row_per_check_naming_the_bad_hosts() -> None:
    from rich.console import Console

    console = Console(record=True, width=80)
    print_report(console, _sixteen())
    lines = console.export_text().splitlines()
    rows = [ln for ln in lines if ln[:1] in ("✓", "✗", "!", "-") and ": " in ln]
    assert [r.split()[1] for r in rows[:3]] == ["clock:", "code:", "stale:"]
    assert "16/16" in rows[0]
    assert "gpu03, gpu11" in rows[1] and "code differs" in rows[1]
    assert "gpu10, gpu11, gpu12, gpu13 +3 more" in rows[2]
    assert not any("┃" in ln or "│" in ln for ln in lines)  # no matrix by default
    assert "  changed pkg/model.py" in lines
    fix = next(ln for ln in lines if ln.startswith("  fix: corral sync"))
    assert fix.endswith("--ssh-config /etc/corral/ssh_config")  # soft-wrapped, never cut


def test_wide_report_is_the_check_by_host_matrix() -> None:
    from rich.console import Console

    console = Console(record=True, width=400)
    print_report(console, _sixteen(), wide=True)
    text = console.export_text()
    header = next(ln for ln in text.splitlines() if "gpu01" in ln)
    assert all(f"gpu{i:02d}" in header for i in range(1, 17))
    assert "✗ code: code differs on gpu03, gpu11" in text and "fix: corral sync" in text


SSH = SshOptions(config="/etc/corral/ssh cfg", user="ml", port=2222, key="~/.ssh/id_x")


def test_stale_fix_carries_the_ssh_options_given() -> None:
    ctx = _ctx({"n2": {"stale": [{"pid": 77, "job": "old", "cmdline": "x"}]}}, ssh=SSH)
    key = os.path.expanduser("~/.ssh/id_x")
    assert stale.check(ctx).fix_command == (
        f"ssh -F '/etc/corral/ssh cfg' -p 2222 -l ml -i {key} n2 kill 77"
    )


def test_connectivity_fix_carries_the_ssh_options_given() -> None:
    ctx = _ctx(errors={"n2": "n2: connection refused"}, ssh=SshOptions(config="/c"))
    fix = connectivity.check(ctx).fix_command
    assert fix is not None and fix.startswith("ssh -v -F /c n2 true")


def test_ssh_command_uses_the_hosts_own_port_user_and_address() -> None:
    (host,) = load_cluster("root@n1:2 address=10.0.0.9 port=2200").hosts
    assert ssh_command(SshOptions(), host, ["kill", "1"]) == "ssh -p 2200 -l root 10.0.0.9 kill 1"
    with_config = ssh_command(SshOptions(config="/c", port=22), host, ["true"])
    assert with_config == "ssh -F /c -p 2200 -l root n1 true"


def _script(path: str, error: str | None = None) -> dict[str, Any]:
    return {"code": {"script": {"path": path, "error": error} if error else {"path": path}}}


def test_missing_script_fails_the_code_check_naming_the_host_uncompared() -> None:
    ctx = _ctx({"n2": _script("/srv/code/train.py", "not found")}, script="train.py", ssh=SSH)
    ctx.reference = CodeReference(None, why_not="cannot compare: x; pass --code-dir")
    result = consistency.check(ctx)
    assert result.status is Status.FAIL
    assert result.hosts["n2"].status is Status.FAIL
    assert result.hosts["n2"].detail == "script /srv/code/train.py: not found"
    assert result.hosts["n1"].status is Status.WARN  # not compared, but there
    assert result.error is not None
    assert "the script train.py cannot be run in /srv/code on n2" in result.error
    assert result.fix_command is not None
    assert result.fix_command.startswith("corral sync --hosts n2 . --dest /srv/code")
    assert "--ssh-config '/etc/corral/ssh cfg' --ssh-user ml --ssh-port 2222" in (
        result.fix_command
    )


def test_missing_script_fails_whatever_the_threshold(tmp_path: Path) -> None:
    (tmp_path / "train.py").write_text("1")
    ref = build_manifest(str(tmp_path))
    per_host: dict[str, dict[str, Any]] = {
        n: {"code": {"tree": ref.to_json(), "script": {"path": "/srv/code/train.py"}}}
        for n in NAMES
    }
    per_host["n3"]["code"]["script"] = {"path": "/srv/code/train.py", "error": "not found"}
    ctx = _ctx(per_host, script="train.py", consistency_threshold=0.5)
    ctx.local_manifest = ref
    result = consistency.check(ctx)
    assert result.status is Status.FAIL and result.hosts["n3"].status is Status.FAIL
    assert "script /srv/code/train.py: not found" in result.hosts["n3"].detail
    assert result.hosts["n1"].status is Status.PASS
    assert result.error is not None and "cannot be run in /srv/code on n3" in result.error
    assert result.fix_command is not None and result.fix_command.startswith(
        "corral sync --hosts n3"
    )
    assert result.data["divergent"]["n3"]["script"] == "/srv/code/train.py: not found"


def test_preflight_options_carry_the_job_id() -> None:
    from corral.job.options import CheckPolicy
    from corral.job.preflight import checklist_options
    from corral.plan.spec import JobSpec

    cluster = _cluster()
    spec = JobSpec(script="train.py", job_id="job-42")
    options = checklist_options(CheckPolicy(), spec, cluster, SshOptions(), None, None)
    assert options.job_id == "job-42" and options.script == "train.py"
