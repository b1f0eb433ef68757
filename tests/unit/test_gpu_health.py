"""GPU health (NVML): the probe over a fake NVML, the evaluator's findings, the
check in the checklist, and the real no-GPU path of this machine."""

from __future__ import annotations

import asyncio
import os
import sys
import types
from collections.abc import Mapping
from typing import Any

import pytest

from corral.agent import gpuprobe
from corral.checks import gpu as gpu_check
from corral.checks.context import CheckContext, ChecklistOptions
from corral.checks.gather import GatherRequest, gather
from corral.checks.result import Status
from corral.checks.runner import CHECK_NAMES, run_checklist
from corral.cluster import load_cluster
from corral.cluster.model import Host
from corral.diagnose.gpu import HostInput, evaluate, job_backend, require_nvml
from corral.errors import ConfigError
from corral.transport.local import LocalTransport

GIB = 1 << 30
BUS = ["00000000:3B:00.0", "00000000:5E:00.0"]
XID_LOG = """\
[ 12.3] nvidia: loading out-of-tree module
[ 99.1] NVRM: Xid (PCI:0000:5e:00): 79, pid=0, GPU has fallen off the bus.
[ 99.2] NVRM: Xid (PCI:0000:3b:00): 13, pid=4242, name=python, Graphics Exception
[ 99.3] NVRM: Xid (PCI:0000:3b:00): 74, pid=0, NVLink: fatal error detected
"""


class FakeNvml:
    """:class:`gpuprobe.Nvml` with scripted answers (two H100s by default)."""

    def __init__(self, gpus: int = 2, **per_gpu: dict[int, Any]) -> None:
        self.n = gpus
        self.per = per_gpu
        self.driver = "550.54.15"
        self.cuda = "12.4"

    def _get(self, key: str, index: int, default: Any = None) -> Any:
        return self.per.get(key, {}).get(index, default)

    def driver_version(self) -> str:
        return self.driver

    def cuda_version(self) -> str | None:
        return self.cuda

    def count(self) -> int:
        return self.n

    def device(self, index: int) -> dict[str, Any]:
        return {
            "name": "NVIDIA H100 80GB HBM3",
            "uuid": f"GPU-{index}",
            "bus_id": BUS[index],
            "memory_total": 80 * GIB,
            "memory_used": self._get("used", index, 0),
        }

    def ecc_uncorrected(self, index: int) -> int | None:
        return int(self._get("ecc", index, 0))

    def remapped_rows(self, index: int) -> dict[str, Any] | None:
        return self._get("rows", index)

    def retired_pending(self, index: int) -> bool | None:
        return self._get("retired", index)

    def clock_reasons(self, index: int) -> int | None:
        return int(self._get("reasons", index, 0))

    def processes(self, index: int) -> list[tuple[int, int | None]]:
        return list(self._get("procs", index, []))

    def utilization(self, index: int) -> int | None:
        return 50 + index

    def temperature(self, index: int) -> int | None:
        return 60 + index


def _health(
    nvml: FakeNvml, log: str | None = None, *, ranks: int = 2, job: str | None = None, **kw: Any
) -> Any:
    probe = {"devices": True, "visible": None, **gpuprobe.collect(nvml, log), **kw}
    return evaluate({"h1": HostInput(probe, ranks=ranks)}, job)["h1"]


def _kinds(health: Any) -> dict[str, str]:
    return {f.kind: f.severity for f in health.findings}


def test_a_healthy_host_passes_naming_its_gpus_and_driver() -> None:
    h = _health(FakeNvml())
    assert h.status == "pass" and h.findings == []
    assert "2x NVIDIA H100" in h.detail and "550.54.15" in h.detail and "12.4" in h.detail


def test_uncorrectable_ecc_errors_fail_with_a_gpu_reset() -> None:
    h = _health(FakeNvml(ecc={1: 3}))
    assert h.status == "fail"
    (f,) = h.findings
    assert (f.kind, f.gpu) == ("ecc", 1) and "3 uncorrectable ECC" in f.text
    assert f.fix_argv == ("nvidia-smi", "--gpu-reset", "-i", "1")


def test_pending_remapped_rows_warn_and_a_failed_remap_fails() -> None:
    pending = {"correctable": 1, "uncorrectable": 0, "pending": True, "failed": False}
    failed = {"correctable": 0, "uncorrectable": 8, "pending": False, "failed": True}
    h = _health(FakeNvml(rows={0: pending, 1: failed}))
    assert h.status == "fail"
    texts = [f.text for f in h.findings]
    assert "GPU 0: remapped rows pending a GPU reset" in texts
    assert any("GPU 1: row remapping failed" in t for t in texts)
    assert _health(FakeNvml(rows={0: pending})).status == "warn"


def test_retired_pages_pending_warn() -> None:
    h = _health(FakeNvml(retired={0: True}))
    assert h.status == "warn" and _kinds(h) == {"retired": "warn"}


def test_xid_lines_are_mapped_to_gpus_and_judged_by_code() -> None:
    h = _health(FakeNvml(), XID_LOG)
    xids = [f for f in h.findings if f.kind == "xid"]
    assert [(f.gpu, f.severity) for f in xids] == [(0, "warn"), (1, "fail")]  # 74, then 79
    assert "Xid 79 (fell off the bus)" in xids[1].text
    assert all("Xid 13" not in f.text for f in h.findings)  # the program's own fault
    assert h.status == "fail"


def test_xid_parser_reads_kernel_and_journal_lines() -> None:
    found = gpuprobe.xid_errors(XID_LOG)
    assert [(x["bus"], x["xid"]) for x in found] == [("0:94:0", 79), ("0:59:0", 13), ("0:59:0", 74)]
    assert gpuprobe.bus_key("00000000:5E:00.0") == "0:94:0"


def test_thermal_and_power_throttling_warn_naming_the_reasons() -> None:
    h = _health(FakeNvml(reasons={1: 0x40 | 0x80 | 0x1}))
    (f,) = h.findings
    assert f.severity == "warn" and f.gpu == 1
    assert "hardware thermal slowdown" in f.text and "hardware power brake" in f.text
    assert "idle" not in f.text


def test_memory_held_by_another_process_is_named_with_pid_and_owner() -> None:
    me = os.getpid()
    gone = 4_000_000  # beyond pid_max: not in this host's /proc (another container)
    h = _health(FakeNvml(procs={0: [(me, 3 * GIB), (gone, GIB)]}))
    (f,) = h.findings
    assert f.kind == "foreign" and f.severity == "warn" and f.gpu == 0
    import pwd

    owner = pwd.getpwuid(os.getuid()).pw_name
    assert f"PID {me} ({owner}:" in f.text and "4.0 GiB held" in f.text
    assert f"PID {gone} (unknown owner: not in this host's /proc" in f.text
    assert f.fix_argv == ("kill", str(me))  # only what this host can see


def test_the_jobs_own_processes_are_not_foreign() -> None:
    probe = {
        "state": "ok",
        "devices": True,
        "driver": "550",
        "cuda": "12.4",
        "gpus": [{"index": 0, "name": "A100", "processes": [{"pid": 9, "job": "j1"}]}],
    }
    assert evaluate({"h": HostInput(probe, ranks=1)}, "j1")["h"].status == "pass"
    assert evaluate({"h": HostInput(probe, ranks=1)}, "j2")["h"].status == "warn"


def _backend_health(backend: str | None, *, ranks: int, gpus: int, **kw: Any) -> Any:
    probe = {"devices": True, "visible": None, **gpuprobe.collect(FakeNvml(gpus), None), **kw}
    return evaluate({"h1": HostInput(probe, ranks=ranks, backend=backend)})["h1"]


def test_more_ranks_than_gpus_fails_an_nccl_job_and_cuda_visible_devices_counts() -> None:
    h = _backend_health("nccl", ranks=3, gpus=2)
    assert _kinds(h) == {"count": "fail"} and h.status == "fail"
    assert "3 ranks but 2 GPU(s): NCCL refuses two ranks on one GPU" in h.detail
    h = _backend_health("nccl", ranks=2, gpus=2, visible="0")
    assert h.status == "fail" and "CUDA_VISIBLE_DEVICES=0" in h.detail


def test_more_ranks_than_gpus_is_a_note_for_gloo_and_a_warning_when_undeclared() -> None:
    # the machine: local:2 (one rank each) on one GPU
    gloo = _backend_health("gloo", ranks=2, gpus=1)
    assert gloo.status == "pass" and _kinds(gloo) == {"count": "info"}
    assert "2 ranks but 1 GPU(s): ranks share GPUs (gloo" in gloo.detail
    unknown = _backend_health(None, ranks=2, gpus=1)
    assert unknown.status == "warn" and _kinds(unknown) == {"count": "warn"}
    assert "fine for gloo/CPU ranks; NCCL ranks would fail" in unknown.detail
    assert "CORRAL_BACKEND=nccl|gloo" in unknown.findings[0].advice
    assert _backend_health(None, ranks=1, gpus=1).findings == []


def test_the_job_declares_its_backend_in_its_env() -> None:
    assert job_backend({}) is None and job_backend({"CORRAL_BACKEND": " "}) is None
    assert job_backend({"CORRAL_BACKEND": "gloo"}) == "gloo"
    assert job_backend({"CORRAL_BACKEND": "NCCL"}) == "nccl"
    assert job_backend({"CORRAL_BACKEND": "auto"}) == "nccl"  # the SDK's pick on a GPU host
    with pytest.raises(ConfigError, match="'mpi' is not a backend") as err:
        job_backend({"CORRAL_BACKEND": "mpi"})
    assert err.value.option == "--env"


@pytest.mark.parametrize(
    ("env", "status"),
    [({}, Status.WARN), ({"CORRAL_BACKEND": "gloo"}, Status.PASS),
     ({"CORRAL_BACKEND": "nccl"}, Status.FAIL)],
)  # fmt: skip
def test_a_cpu_job_on_a_one_gpu_machine_passes_the_preflight(
    env: dict[str, str], status: Status
) -> None:
    """``corral run --hosts local:2`` on one GPU: the job's env reaches the gpu check
    through the pre-flight's options; only an NCCL job is refused."""
    from corral.job.options import CheckPolicy
    from corral.job.preflight import checklist_options
    from corral.plan.spec import JobSpec
    from corral.transport.options import SshOptions

    cluster = load_cluster("local:2")
    spec = JobSpec(script="train.py", nproc_per_node=1, env=env)
    opts = checklist_options(CheckPolicy(), spec, cluster, SshOptions(), None, None)
    one_gpu = {"devices": True, "visible": None, **gpuprobe.collect(FakeNvml(1), None)}
    result = gpu_check.check(_ctx(cluster, {"local-0": one_gpu}, opts))
    assert result.status is status, result
    if status is not Status.FAIL:
        assert result.error is None


def test_driver_and_cuda_versions_that_differ_across_hosts_warn_on_the_odd_host() -> None:
    probes: dict[str, Mapping[str, Any]] = {}
    for name in ("a", "b", "c"):
        nvml = FakeNvml()
        if name == "c":
            nvml.driver, nvml.cuda = "535.104.05", "12.2"
        probes[name] = {"devices": True, **gpuprobe.collect(nvml, None)}
    health = evaluate({h: HostInput(p, ranks=2) for h, p in probes.items()})
    assert health["a"].status == health["b"].status == "pass"
    assert health["c"].status == "warn"
    texts = [f.text for f in health["c"].findings]
    assert texts == [
        "driver 535.104.05 differs from the other hosts' 550.54.15",
        "CUDA 12.2 differs from the other hosts' 12.4",
    ]


def test_a_driver_older_than_torchs_cuda_fails_on_a_major_version() -> None:
    probe = {"devices": True, **gpuprobe.collect(FakeNvml(), None)}
    assert evaluate({"h": HostInput(probe, 2, "12.8")})["h"].status == "warn"
    assert evaluate({"h": HostInput(probe, 2, "13.0")})["h"].status == "fail"
    assert evaluate({"h": HostInput(probe, 2, "12.1")})["h"].status == "pass"


def test_nvml_missing_warns_only_with_nvidia_devices() -> None:
    missing = {"state": "nvml_missing", "detail": "NVML not installed: pip install 'corral[gpu]'"}
    with_devices = evaluate({"h": HostInput({**missing, "devices": True})})["h"]
    assert with_devices.status == "warn" and "corral[gpu]" in with_devices.detail
    without = evaluate({"h": HostInput({**missing, "devices": False})})["h"]
    assert (without.status, without.detail) == ("skip", "no GPUs")


def test_the_check_maps_findings_to_host_statuses_and_ssh_fixes() -> None:
    cluster = load_cluster("g1:2,g2:2")
    bad = {"devices": True, "visible": None, **gpuprobe.collect(FakeNvml(ecc={0: 1}), None)}
    good = {"devices": True, "visible": None, **gpuprobe.collect(FakeNvml(), None)}
    ctx = _ctx(cluster, {"g1": bad, "g2": good})
    result = gpu_check.check(ctx)
    assert result.status is Status.FAIL
    assert result.hosts["g2"].status is Status.PASS
    assert result.error is not None and result.error.startswith("g1: GPU 0: 1 uncorrectable")
    assert result.fix_command == "ssh g1 nvidia-smi --gpu-reset -i 0"
    assert result.data["g1"]["findings"][0]["kind"] == "ecc"


def _ctx(
    cluster: Any, probes: dict[str, Any], options: ChecklistOptions | None = None
) -> CheckContext:
    from corral.checks.gather import HostFacts

    facts = {
        h.name: HostFacts(
            host=h, facts={gpu_check.FACTS_KEY: probes.get(h.name) or {}, "software": {}}
        )
        for h in cluster.hosts
    }
    return CheckContext(
        options=options or ChecklistOptions(cluster=cluster),
        cluster=cluster,
        master=cluster.hosts[0],
        master_addr="127.0.0.1",
        workdir="/tmp",
        facts=facts,
    )


# ------------------------------------------------------------------ NVML itself


def _fake_pynvml(init_error: int | None = None) -> types.ModuleType:
    nv = types.ModuleType("pynvml")

    class NVMLError(Exception):
        def __init__(self, value: int) -> None:
            super().__init__(f"NVML error {value}")
            self.value = value

    def not_supported(*_: Any) -> Any:
        raise NVMLError(3)

    def init() -> None:
        if init_error is not None:
            raise NVMLError(init_error)

    handle = object()
    nv.__dict__.update(
        NVMLError=NVMLError,
        NVML_ERROR_LIBRARY_NOT_FOUND=12,
        NVML_ERROR_DRIVER_NOT_LOADED=9,
        NVML_MEMORY_ERROR_TYPE_UNCORRECTED=1,
        NVML_VOLATILE_ECC=0,
        NVML_TEMPERATURE_GPU=0,
        nvmlInit=init,
        nvmlShutdown=lambda: None,
        nvmlSystemGetDriverVersion=lambda: b"550.54.15",
        nvmlSystemGetCudaDriverVersion=lambda: 12040,
        nvmlDeviceGetCount=lambda: 1,
        nvmlDeviceGetHandleByIndex=lambda i: handle,
        nvmlDeviceGetName=lambda h: "NVIDIA A100-SXM4-40GB",
        nvmlDeviceGetUUID=lambda h: "GPU-x",
        nvmlDeviceGetPciInfo=lambda h: types.SimpleNamespace(busId="00000000:07:00.0"),
        nvmlDeviceGetMemoryInfo=lambda h: types.SimpleNamespace(total=40 * GIB, used=GIB),
        nvmlDeviceGetTotalEccErrors=lambda h, kind, counter: 2 if (kind, counter) == (1, 0) else 0,
        nvmlDeviceGetRemappedRows=lambda h: (0, 1, 1, 0),
        nvmlDeviceGetRetiredPagesPendingStatus=not_supported,
        nvmlDeviceGetCurrentClocksEventReasons=lambda h: 0x20,
        nvmlDeviceGetComputeRunningProcesses=lambda h: [
            types.SimpleNamespace(pid=os.getpid(), usedGpuMemory=GIB)
        ],
        nvmlDeviceGetUtilizationRates=lambda h: types.SimpleNamespace(gpu=87, memory=30),
        nvmlDeviceGetTemperature=lambda h, sensor: 71,
    )
    return nv


def test_the_pynvml_adapter_reads_every_answer(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", _fake_pynvml())
    nvml, state, _ = gpuprobe.open_nvml()
    assert state == "ok" and nvml is not None
    facts = gpuprobe.collect(nvml, None)
    (g,) = facts["gpus"]
    assert (facts["driver"], facts["cuda"]) == ("550.54.15", "12.4")
    assert g["ecc_uncorrected"] == 2 and g["retired_pending"] is None  # not supported
    assert g["remapped_rows"] == {
        "correctable": 0,
        "uncorrectable": 1,
        "pending": True,
        "failed": False,
    }
    assert g["clock_reasons"] == 0x20 and g["processes"][0]["pid"] == os.getpid()
    (s,) = gpuprobe.sample(nvml)
    assert s == {
        "index": 0,
        "util": 87,
        "mem_used_mib": 1024,
        "mem_total_mib": 40960,
        "temp_c": 71,
        "pids": [os.getpid()],
    }


def test_nvml_without_a_driver_is_no_gpus_and_without_pynvml_not_installed(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(gpuprobe, "nvidia_devices", lambda: False)
    monkeypatch.setitem(sys.modules, "pynvml", _fake_pynvml(init_error=12))
    assert gpuprobe.open_nvml()[1] == "no_gpus"
    monkeypatch.setattr(gpuprobe, "nvidia_devices", lambda: True)
    nvml, state, detail = gpuprobe.open_nvml()
    assert (nvml, state) == (None, "error") and "NVML could not start" in detail
    monkeypatch.setitem(sys.modules, "pynvml", None)  # import fails
    assert gpuprobe.probe() == {
        "devices": True,
        "visible": os.environ.get("CUDA_VISIBLE_DEVICES"),
        "state": "nvml_missing",
        "detail": "NVML not installed: pip install 'corral[gpu]' (or nvidia-ml-py)",
    }
    with pytest.raises(ConfigError, match=r"corral\[gpu\]"):
        require_nvml()


# ------------------------------------------------------------------ this machine (no GPU)


def test_this_machine_without_gpus_reports_no_gpus_through_the_shipped_probe() -> None:
    # a non-local host over LocalTransport: hostside + gpuprobe travel over stdin, like SSH
    facts = asyncio.run(gather(LocalTransport(), [Host(name="box")], GatherRequest(), master=None))
    health = facts["box"].facts[gpu_check.FACTS_KEY]
    assert health["devices"] is False
    assert health["state"] in ("no_gpus", "nvml_missing")
    verdict = evaluate({"box": HostInput(health, ranks=4)})["box"]
    assert (verdict.status, verdict.detail) == ("skip", "no GPUs")


def test_the_checklist_runs_the_gpu_check_and_nothing_fails_without_gpus() -> None:
    assert "gpu" in CHECK_NAMES
    cluster = load_cluster("local:2")
    outcome = asyncio.run(run_checklist(ChecklistOptions(cluster=cluster, smoke=False)))
    check = outcome.report.check("gpu")
    assert check.status is Status.SKIP and check.summary == "no GPUs"
    assert {h.detail for h in check.hosts.values()} == {"no GPUs"}
    assert check not in outcome.report.failed
