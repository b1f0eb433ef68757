"""``fleet.capabilities.probe_machines`` across the netns testbed's real sshd hosts."""

from __future__ import annotations

import asyncio
import contextlib
import re
import time
from collections.abc import Awaitable, Callable, Iterator
from typing import TypeVar

import pytest

from corral.cluster import Host, load_cluster
from corral.fleet.capabilities import KILL_GRACE, MachineHealth, probe_machines
from corral.testbed import Testbed
from corral.transport.options import SshOptions
from corral.transport.ssh import SshTransport

pytestmark = pytest.mark.netns

T = TypeVar("T")

#: Deadline for hosts that answer, generous for a loaded 2-core machine.
HEALTHY = 60.0
#: Deadline for a cut link.
SHORT = 6.0
#: Seconds allowed past a deadline for start-up and teardown on a loaded machine.
MARGIN = 20.0


def hosts_of(tb: Testbed, *names: str) -> list[Host]:
    cluster = load_cluster(str(tb.hostfile))
    return [cluster.host(n) for n in names]


Results = dict[str, MachineHealth]


@contextlib.contextmanager
def link_cut(tb: Testbed, host: str) -> Iterator[None]:
    """``host`` off the network for the block."""
    tb.cut_link(host)
    try:
        yield
    finally:
        tb.restore_link(host)


def over_ssh(tb: Testbed, steps: Callable[[SshTransport], Awaitable[T]]) -> T:
    """Run ``steps`` with one SshTransport to the testbed (its connections kept)."""

    async def main() -> T:
        transport = SshTransport(SshOptions(config=str(tb.ssh_config)))
        try:
            return await steps(transport)
        finally:
            await transport.close()

    return asyncio.run(main())


async def timed(
    transport: SshTransport, hosts: list[Host], deadline: float
) -> tuple[Results, float]:
    """One probe_machines call and how long it took."""
    started = time.monotonic()
    results = await probe_machines(transport, hosts, deadline=deadline)
    return results, time.monotonic() - started


def assert_online(health: MachineHealth, name: str) -> None:
    assert health.online, health.error
    assert health.error is None
    caps = health.capabilities
    assert caps["hostname"] == name
    assert caps["cpus"] >= 1 and caps["memory_bytes"] > 0
    assert caps["disk"]["total_bytes"] > 0
    assert health.latency_ms is not None and health.latency_ms > 0
    assert 0 <= health.load["cpu_percent"] <= 100
    assert len(health.load["load_avg"]) == 3


def test_hosts_report_their_capabilities(testbed: Testbed) -> None:
    hosts = hosts_of(testbed, "tb1", "tb2")
    results, _ = over_ssh(testbed, lambda t: timed(t, hosts, HEALTHY))
    assert list(results) == ["tb1", "tb2"]
    for name, health in results.items():
        assert_online(health, name)


def test_a_cut_link_is_offline_within_the_deadline(healthy_testbed: Testbed) -> None:
    # no connection to tb2 yet: the SSH connect itself never gets an answer, and either
    # the transport's connect timeout (the testbed's ConnectTimeout) or the deadline ends it
    tb = healthy_testbed
    hosts = hosts_of(tb, "tb1", "tb2")
    with link_cut(tb, "tb2"):
        results, took = over_ssh(tb, lambda t: timed(t, hosts, SHORT))
    assert took < SHORT + KILL_GRACE + MARGIN  # the bound is the behaviour
    assert_online(results["tb1"], "tb1")
    tb2 = results["tb2"]
    assert not tb2.online and tb2.latency_ms is None and tb2.capabilities == {}
    assert tb2.error is not None and "link cut?" in tb2.error
    assert re.search(r"within \d+ s", tb2.error), tb2.error


def test_a_link_cut_under_an_open_connection_is_offline_within_the_deadline(
    healthy_testbed: Testbed,
) -> None:
    # the second round finds a cached connection whose link is dead
    tb = healthy_testbed
    hosts = hosts_of(tb, "tb1", "tb2")

    async def steps(transport: SshTransport) -> tuple[Results, Results, float]:
        first, _ = await timed(transport, hosts, HEALTHY)
        with link_cut(tb, "tb2"):
            last, took = await timed(transport, hosts, SHORT)
        return first, last, took

    first, last, took = over_ssh(tb, steps)
    for name, health in first.items():
        assert_online(health, name)
    assert took < SHORT + KILL_GRACE + MARGIN  # the bound is the behaviour
    assert_online(last["tb1"], "tb1")
    tb2 = last["tb2"]
    assert not tb2.online and tb2.error is not None
    assert f"no answer within {SHORT:g} s" in tb2.error
