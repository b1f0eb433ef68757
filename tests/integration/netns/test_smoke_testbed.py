"""The collective smoke test (check 9) across the netns testbed: runners started
over real SSH, ranks on three hosts rendezvous on tb1 over the testbed network.

The passing test runs two ranks on tb2 (a runner with several workers); the failing
ones run one rank per host, which shows the host named as well (each rank imports
torch: ~1.5 CPU-s; issue 30)."""

from __future__ import annotations

import asyncio
import sys
import time
from collections.abc import Awaitable
from typing import TypeVar

import psutil
import pytest

from corral.checks.result import CheckResult, Status
from corral.checks.smoke import KILL_GRACE, MARGIN, smoke_test
from corral.cluster import load_cluster
from corral.testbed import Testbed
from corral.transport.options import SshOptions
from corral.transport.ssh import SshTransport

pytestmark = [pytest.mark.netns, pytest.mark.torch]  # the [torch] extra is part of `make setup`

T = TypeVar("T")
HOSTS = ("tb1", "tb2", "tb3")
NPROC = {"tb1": 1, "tb2": 2, "tb3": 1}
ONE_EACH = dict.fromkeys(HOSTS, 1)
CONNECT_TIMEOUT = 10.0
SLACK = MARGIN + 2 * KILL_GRACE + CONNECT_TIMEOUT + 15


def arun(coro: Awaitable[T]) -> T:
    async def main() -> T:
        return await coro

    return asyncio.run(main())


def free_port_on(tb: Testbed, host: str) -> int:
    """A port nothing listens on in ``host``'s namespace."""
    code = "import socket; s = socket.socket(); s.bind(('', 0)); print(s.getsockname()[1])"
    out = tb.run_on(host, [sys.executable, "-c", code], check=True)
    return int(out.stdout.strip())


def smoke_pids(tb: Testbed, host: str) -> list[str]:
    """Smoke-test processes (runners, ranks) still alive on ``host``."""
    found = []
    for pid in tb.pids_on(host):
        try:
            proc = psutil.Process(pid)
            if proc.status() == psutil.STATUS_ZOMBIE:
                continue
            cmd = " ".join(proc.cmdline())
        except psutil.Error:
            continue
        if "corral.checks.smoke" in cmd:
            found.append(f"{pid} {cmd[:120]}")
    return found


def wait_no_smoke(
    tb: Testbed, hosts: tuple[str, ...], within: float = 10.0
) -> dict[str, list[str]]:
    end = time.monotonic() + within
    while True:
        left = {h: smoke_pids(tb, h) for h in hosts}
        left = {h: p for h, p in left.items() if p}
        if not left or time.monotonic() >= end:
            return left
        time.sleep(0.2)


async def smoke(
    tb: Testbed,
    *,
    deadline: float,
    interfaces: dict[str, str] | None = None,
    nproc: dict[str, int] = NPROC,
) -> tuple[CheckResult, float]:
    cluster = load_cluster(str(tb.hostfile))
    hosts = list(cluster.hosts)
    master = cluster.host("tb1")
    transport = SshTransport.from_options(
        SshOptions(config=str(tb.ssh_config)), connect_timeout=CONNECT_TIMEOUT
    )
    port = await asyncio.to_thread(free_port_on, tb, "tb1")
    started = time.monotonic()
    try:
        result = await smoke_test(
            transport,
            hosts,
            master=master,
            master_addr=tb.host("tb1").address,
            port=port,
            nproc=nproc,
            backend="gloo",
            env={
                h: {"GLOO_SOCKET_IFNAME": (interfaces or {}).get(h) or tb.host(h).interface}
                for h in HOSTS
            },
            deadline=deadline,
        )
        return result, time.monotonic() - started
    finally:
        await transport.close()


def test_smoke_passes_across_the_testbed(testbed: Testbed) -> None:
    result, seconds = arun(smoke(testbed, deadline=60.0))
    assert result.status is Status.PASS, result.to_json()
    assert list(result.hosts) == list(HOSTS)
    assert result.hosts["tb2"].detail == "joined, 2 ranks"
    assert all(h.status is Status.PASS for h in result.hosts.values())
    assert result.data["world_size"] == 4
    assert result.data["backend"] == "gloo"
    assert result.data["bus_bandwidth_gbps"] > 0
    assert result.data["ranks"] == {"tb1": [0], "tb2": [1, 2], "tb3": [3]}
    assert result.data["never_joined"] == []
    print(f"3-host smoke test: {seconds:.2f} s; {result.summary}")
    assert wait_no_smoke(testbed, HOSTS) == {}


def test_cut_host_is_named_and_nothing_stays(healthy_testbed: Testbed) -> None:
    tb = healthy_testbed
    deadline = 20.0
    tb.cut_link("tb3")
    try:
        result, seconds = arun(smoke(tb, deadline=deadline, nproc=ONE_EACH))
        print(f"cut tb3: {seconds:.2f} s; {result.error}")
        assert seconds < deadline + SLACK  # the hard deadline is the behaviour under test
        assert result.status is Status.FAIL, result.to_json()
        assert result.data["never_joined"] == ["tb3"]
        assert result.hosts["tb3"].status is Status.FAIL
        assert result.hosts["tb3"].detail.startswith("never joined:")
        assert all(result.hosts[h].status is not Status.FAIL for h in ("tb1", "tb2"))
        assert result.error is not None and result.error.startswith("tb3: never joined")
        assert result.fix_command == "corral ping"
        assert wait_no_smoke(tb, ("tb1", "tb2")) == {}
    finally:
        tb.restore_link("tb3")
    assert wait_no_smoke(tb, HOSTS) == {}


def test_wrong_interface_on_one_host_is_named(testbed: Testbed) -> None:
    interfaces = {"tb2": "nic-missing"}
    result, seconds = arun(smoke(testbed, deadline=30.0, interfaces=interfaces, nproc=ONE_EACH))
    print(f"bad interface on tb2: {seconds:.2f} s; {result.error}")
    assert result.status is Status.FAIL, result.to_json()
    assert result.hosts["tb2"].status is Status.FAIL
    assert "init_process_group(gloo) failed" in result.hosts["tb2"].detail
    assert result.hosts["tb1"].status is not Status.FAIL
    assert result.hosts["tb3"].status is not Status.FAIL
    assert result.error is not None and "GLOO_SOCKET_IFNAME" in result.error
    assert wait_no_smoke(testbed, HOSTS) == {}
