"""Machine facts on this (Linux) machine, and fleet.capabilities over local, fake and
local-process transports (no SSH)."""

from __future__ import annotations

import asyncio
import json
import os
import time
from collections.abc import Sequence
from pathlib import Path

import pytest

from corral.cluster import Host
from corral.fleet import machinefacts
from corral.fleet.capabilities import (
    KILL_GRACE,
    MachineHealth,
    local_health,
    probe_machines,
)
from corral.transport.base import Transport
from corral.transport.fake import FakeNode, FakeTransport
from corral.transport.local import LocalTransport
from tests.unit.test_ping import fails, hangs, wrong_output

FAKE_SMI = """\
#!/bin/sh
case "$*" in
  *index,utilization.gpu,memory.used*)
    echo "0, 37, 1024"
    echo "1, 100, 80000" ;;
  *name,memory.total*)
    echo "NVIDIA H100 80GB HBM3, 81559"
    echo "NVIDIA A100-SXM4-40GB, 40960" ;;
  *) exit 2 ;;
esac
"""


@pytest.fixture
def no_gpu_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A PATH (an empty directory) on which no nvidia-smi is found."""
    bindir = tmp_path / "bin"
    bindir.mkdir()
    monkeypatch.setenv("PATH", str(bindir))


@pytest.fixture
def fake_smi(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    """A fake ``nvidia-smi`` with two GPUs first on PATH; returns the new PATH."""
    bindir = tmp_path / "smi"
    bindir.mkdir()
    script = bindir / "nvidia-smi"
    script.write_text(FAKE_SMI)
    script.chmod(0o755)
    path = f"{bindir}{os.pathsep}{os.environ.get('PATH', '')}"
    monkeypatch.setenv("PATH", path)
    return path


@pytest.fixture
def raw_stdin(monkeypatch: pytest.MonkeyPatch) -> dict[str, bytes]:
    """FakeNode keeps what is written to its stdin as bytes, by host name (the shipped
    program is no JSON op)."""
    written: dict[str, bytes] = {}

    def write(self: FakeNode, data: bytes) -> None:
        written[self.host.name] = written.get(self.host.name, b"") + data

    monkeypatch.setattr(FakeNode, "write", write)
    return written


async def probe(
    transport: Transport, hosts: Sequence[Host], deadline: float = 30.0
) -> dict[str, MachineHealth]:
    try:
        return await probe_machines(transport, hosts, deadline=deadline)
    finally:
        await transport.close()


# --------------------------------------------------------------- host side


def test_capabilities_are_sane(tmp_path: Path) -> None:
    caps = machinefacts.capabilities()
    assert caps["cpus"] >= 1
    assert caps["memory_bytes"] > 0
    assert caps["hostname"] and caps["python"].count(".") == 2
    assert caps["platform"].startswith("Linux-")
    disk = caps["disk"]
    assert disk["path"] == os.path.expanduser("~")
    assert disk["total_bytes"] > 0 and 0 <= disk["free_bytes"] <= disk["total_bytes"]
    assert machinefacts.capabilities(str(tmp_path))["disk"]["path"] == str(tmp_path)


def test_a_missing_disk_path_is_reported_not_raised(tmp_path: Path) -> None:
    disk = machinefacts.disk(str(tmp_path / "absent"))
    assert disk["total_bytes"] is None and disk["free_bytes"] is None
    assert disk["error"]


def test_load_is_sane() -> None:
    busy = machinefacts.load(0.05)
    assert busy["cpu_percent"] is not None and 0 <= busy["cpu_percent"] <= 100
    assert 0 < busy["memory_percent"] <= 100
    assert len(busy["load_avg"]) == 3 and all(v >= 0 for v in busy["load_avg"])


def test_without_nvidia_smi_there_are_no_gpus(no_gpu_path: None) -> None:
    caps = machinefacts.capabilities()
    # with an NVIDIA driver, its /proc entries still name the GPUs, without memory
    driver = Path("/proc/driver/nvidia/gpus")
    assert caps["gpu_count"] == (len(list(driver.iterdir())) if driver.is_dir() else 0)
    assert all(g["memory_mib"] is None for g in caps["gpus"])
    assert caps["gpu_memory_mib"] == 0 and caps["gpu_memory_min_mib"] is None
    assert machinefacts.load(0.0)["gpus"] == []


def test_gpus_from_a_fake_nvidia_smi(fake_smi: str) -> None:
    caps = machinefacts.capabilities()
    assert caps["gpus"] == [
        {"index": 0, "name": "NVIDIA H100 80GB HBM3", "memory_mib": 81559},
        {"index": 1, "name": "NVIDIA A100-SXM4-40GB", "memory_mib": 40960},
    ]
    assert caps["gpu_count"] == 2
    assert caps["gpu_memory_mib"] == 81559 + 40960
    assert caps["gpu_memory_min_mib"] == 40960
    assert machinefacts.load(0.0)["gpus"] == [
        {"index": 0, "utilization_percent": 37.0, "memory_used_mib": 1024},
        {"index": 1, "utilization_percent": 100.0, "memory_used_mib": 80000},
    ]


def test_unsupported_gpu_fields_are_none(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    script = tmp_path / "nvidia-smi"
    script.write_text('#!/bin/sh\necho "0, [N/A], [N/A]"\necho "garbage"\n')
    script.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    assert machinefacts.gpu_load() == [
        {"index": 0, "utilization_percent": None, "memory_used_mib": None}
    ]


def test_main_prints_one_json_line(capsys: pytest.CaptureFixture[str]) -> None:
    assert machinefacts.main({"sample_s": 0.0}) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 1
    doc = json.loads(lines[0])
    assert set(doc) == {"capabilities", "load", "took_s"}


# --------------------------------------------------------------- coordinator side


def test_local_health_is_online() -> None:
    health = local_health("here", sample_s=0.0)
    assert health.online and health.error is None and health.name == "here"
    assert health.latency_ms == 0.0
    assert health.capabilities["cpus"] >= 1 and health.load["memory_percent"] > 0
    assert abs(health.checked - time.time()) < 60
    doc = health.to_dict()
    assert doc["online"] is True and doc["capabilities"]["memory_bytes"] > 0


def test_local_hosts_are_probed_in_process() -> None:
    hosts = [Host(name="local-0", local=True), Host(name="local-1", local=True)]
    transport = FakeTransport({})  # would raise KeyError if a process were started
    results = asyncio.run(probe(transport, hosts))
    assert list(results) == ["local-0", "local-1"]
    assert all(r.online and r.capabilities["cpus"] >= 1 for r in results.values())
    assert transport.nodes == {}


def test_the_shipped_probe_runs_in_a_real_process(fake_smi: str) -> None:
    # a non-local host over LocalTransport: the program is shipped over stdin, like SSH
    host = Host(name="box", env={"PATH": fake_smi})
    results = asyncio.run(probe(LocalTransport(), [host]))
    box = results["box"]
    assert box.online, box.error
    assert box.latency_ms is not None and box.latency_ms > 0
    assert box.capabilities["cpus"] >= 1 and box.capabilities["memory_bytes"] > 0
    assert box.capabilities["gpu_count"] == 2
    assert [g["utilization_percent"] for g in box.load["gpus"]] == [37.0, 100.0]
    assert 0 <= box.load["cpu_percent"] <= 100


def test_a_host_that_never_answers_is_offline_by_the_deadline(raw_stdin: dict[str, bytes]) -> None:
    transport = FakeTransport({"dead": hangs})
    started = time.monotonic()
    results = asyncio.run(probe(transport, [Host(name="dead")], deadline=1.0))
    took = time.monotonic() - started
    dead = results["dead"]
    assert not dead.online and dead.latency_ms is None
    assert dead.error is not None and "no answer within 1 s" in dead.error
    assert dead.capabilities == {} and dead.load == {}
    assert transport.nodes["dead"].signals == [9]  # the probe was killed
    assert took < 1.0 + KILL_GRACE + 8  # generous: the bound is the behaviour


def test_failures_are_specific_and_do_not_stop_the_others(raw_stdin: dict[str, bytes]) -> None:
    transport = FakeTransport({"nopy": fails, "junk": wrong_output}, unreachable=["gone"])
    hosts = [Host(name="gone"), Host(name="nopy"), Host(name="junk"), Host(name="me", local=True)]
    results = asyncio.run(probe(transport, hosts, deadline=10.0))
    assert list(results) == ["gone", "nopy", "junk", "me"]
    assert results["gone"].error == "cannot connect (unreachable)"
    assert results["nopy"].error == "sh: echo: not found (exit 127)"
    assert results["junk"].error == "the probe exited with status 0 without an answer"
    assert not any(results[h].online for h in ("gone", "nopy", "junk"))
    assert results["me"].online


def test_the_program_travels_on_stdin(raw_stdin: dict[str, bytes]) -> None:
    async def answers(node: FakeNode) -> int:
        node.stdout.feed_data(b'{"capabilities": {"cpus": 4}, "load": {}, "took_s": 0.5}\n')
        return 0

    transport = FakeTransport({"a": answers})
    results = asyncio.run(probe(transport, [Host(name="a")]))
    assert results["a"].online and results["a"].capabilities == {"cpus": 4}
    node = transport.nodes["a"]
    assert node.argv[:2] == ["sh", "-c"] and node.stdin_closed
    assert b"def capabilities(" in raw_stdin["a"]
    assert "corral.fleet.machinefacts:main" in node.argv


def test_deadline_must_be_positive() -> None:
    with pytest.raises(ValueError, match="deadline"):
        asyncio.run(probe_machines(FakeTransport({}), [], deadline=0))


def test_a_host_without_the_interpreter_names_it() -> None:
    host = Host(name="box", python="corral-no-such-python")
    results = asyncio.run(probe(LocalTransport(), [host]))
    box = results["box"]
    assert not box.online
    assert box.error == "no python interpreter found (tried: corral-no-such-python) (exit 127)"
