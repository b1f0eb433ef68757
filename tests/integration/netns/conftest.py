"""Fixtures for tests on the netns testbed (3 simulated hosts with real sshd).

``testbed`` is session-scoped: one ``up`` for the whole run, one ``down`` at the
end. Tests that break a host (cut link, stopped sshd) must put it back, e.g.
with ``testbed.repair()`` in a ``finally``. Without root or sshd the fixture
skips, except under ``CI=true`` where it fails: CI must never skip these.

Each host has its own ``/srv``, ``/tmp`` and home, so ``tmp_path`` is overridden
here by a directory every host sees at the same path (as an NFS home would be):
code, scripts and files the tests share with the hosts go there, while what must
differ per host goes to ``/srv/corral/...`` (seen from here via ``host_path``).
"""

from __future__ import annotations

import re
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from corral.testbed import Testbed, exclusive, missing_requirements
from tests.conftest import missing_dependency

TESTBED_HOSTS = 3


def require_testbed_support() -> None:
    """Skip (or fail under CI=true) when this machine cannot run the testbed."""
    __tracebackhide__ = True
    problems = missing_requirements()
    if problems:
        missing_dependency("netns testbed unavailable: " + "; ".join(problems))


@pytest.fixture(scope="session")
def testbed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Testbed]:
    """A healthy 3-host testbed (tb1..tb3) for the whole session, removed at the end.

    A testbed left over by a crashed earlier run is taken down first.
    """
    require_testbed_support()
    # One testbed per machine: a second pytest session (or a benchmark) waits here.
    with exclusive():
        leftover = Testbed.running()
        if leftover is not None:
            leftover.down()
        tb = Testbed(tmp_path_factory.mktemp("testbed"))
        tb.up(TESTBED_HOSTS)
        try:
            yield tb
        finally:
            try:
                tb.down()
            finally:
                shutil.rmtree(shared_root(tb), ignore_errors=True)


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
