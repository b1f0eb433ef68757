"""Fixtures for tests on the netns testbed (3 simulated hosts with real sshd).

``testbed`` is session-scoped: one ``up`` for the whole run, one ``down`` at the
end. Each pytest-xdist worker has a testbed of its own: instance ``N`` on worker
``gwN`` (tests/parallel.py ``worker_instance``; 0 in a run without xdist), with its
own namespaces, bridge and subnet (``10.77.N.0/24``) but the same host names tb1..tb3,
so a test asks the testbed for an address (``testbed.host("tb2").address``) rather
than writing one. Tests that break a host (cut link, stopped sshd) must put it back, e.g.
with ``testbed.repair()`` in a ``finally``. Without root or sshd the fixture
skips, except under ``CI=true`` where it fails: CI must never skip these.

Each host has its own ``/srv``, ``/tmp`` and home, so ``tmp_path`` is overridden
here by a directory every host sees at the same path (as an NFS home would be):
code, scripts and files the tests share with the hosts go there, while what must
differ per host goes to ``/srv/corral/...`` (seen from here via ``host_path``).
"""

from __future__ import annotations

import ipaddress
import re
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from corral.testbed import Testbed, exclusive, missing_requirements
from tests.conftest import missing_dependency
from tests.parallel import worker_instance

TESTBED_HOSTS = 3


def require_testbed_support() -> None:
    """Skip (or fail under CI=true) when this machine cannot run the testbed."""
    __tracebackhide__ = True
    problems = missing_requirements()
    if problems:
        missing_dependency("netns testbed unavailable: " + "; ".join(problems))


@pytest.fixture(scope="session")
def testbed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Testbed]:
    """A healthy 3-host testbed (tb1..tb3) of this worker's instance for the whole
    session, removed at the end.

    Testbeds left over by a crashed earlier run are taken down first: this
    instance's, and any other instance's that no session holds now.
    """
    require_testbed_support()
    instance = worker_instance()
    # One testbed per instance: a second pytest session (or a benchmark) waits here.
    with exclusive(instance):
        take_down_leftovers(instance)
        tb = Testbed(tmp_path_factory.mktemp("testbed"), instance=instance)
        tb.up(TESTBED_HOSTS)
        try:
            yield tb
        finally:
            try:
                tb.down()
            finally:
                shutil.rmtree(shared_root(tb), ignore_errors=True)


def take_down_leftovers(instance: int) -> None:
    """Take down the testbed of ``instance`` (whose lock the caller holds) and every
    other instance's whose lock is free (left by a killed run; a live session or a
    benchmark holds its instance's lock)."""
    for leftover in Testbed.all_running():
        if leftover.instance == instance:
            leftover.down()
            continue
        with exclusive(leftover.instance, wait=False) as free:
            if free:
                leftover.down()


def spare_address(tb: Testbed) -> str:
    """An address in ``tb``'s subnet that no host has (nothing answers there)."""
    return str(ipaddress.ip_network(tb.subnet)[250])


def shared_root(tb: Testbed) -> Path:
    """Where the shared ``tmp_path`` dirs live: in the state dir, which every host sees
    at its own path, and which ``down`` (of a fault test's repair, say) leaves alone."""
    return tb.state_dir / "shared"


@pytest.fixture
def tmp_path(testbed: Testbed, request: pytest.FixtureRequest) -> Iterator[Path]:
    """A fresh directory per test, at the same path here and on every host."""
    root = shared_root(testbed)
    root.mkdir(exist_ok=True)
    name = re.sub(r"\W", "_", request.node.name)[:30]
    path = Path(tempfile.mkdtemp(prefix=f"{name}-", dir=root))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def healthy_testbed(testbed: Testbed) -> Iterator[Testbed]:
    """The session testbed, repaired before and after the test (for fault tests)."""
    testbed.repair()
    try:
        yield testbed
    finally:
        testbed.repair()
