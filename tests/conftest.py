"""Test-wide rules: a missing dependency skips here, but fails under ``CI=true``.

DESIGN §7: CI runs on a fresh machine that installs everything ``make test``
needs; there a missing dependency (torch, sshd, ...) is a broken setup, never a
reason to skip. So:

- ``require(module)`` / ``require_torch()`` import a dependency or, when it is
  missing, skip the test with a clear reason, or fail it under ``CI=true``. Use
  them instead of ``pytest.importorskip``.
- a test marked ``@pytest.mark.torch`` gets ``require_torch()`` before it runs when
  torch is not installed; the check finds torch without importing it, so the test's
  process stays light unless its body imports torch. Mark a module that needs torch
  with ``pytestmark = pytest.mark.torch``, never ``require_torch()`` at module level:
  every xdist worker imports every test module while collecting (issue 30).
- under ``CI=true`` any skip that still happens (a stray ``pytest.skip``, an
  ``importorskip`` in a new test, a ``skipif``) is reported as a failure, for a
  test or for a whole module, so a green CI run means every test ran.
"""

from __future__ import annotations

import gc
import importlib
import importlib.util
import os
import sys
from collections.abc import Iterator
from types import ModuleType

import pytest

# pytest caches each test module's assertion-rewritten byte code only when Python may
# write byte code; with PYTHONDONTWRITEBYTECODE set (as on the CI machines) every
# xdist worker rewrote all ~600 test modules again, half of its collection CPU (issue
# 30). The cache goes to tests' __pycache__ dirs (git-ignored); only this process
# writes it: the processes the tests start inherit the environment as it is.
sys.dont_write_bytecode = False

# The cyclic garbage collector of a pytest process ran ~1,500 times in 280 CLI tests,
# a fifth of their CPU, walking the same long-lived objects (the collected tests, the
# imported modules) each time. Collected less often, and with what collection built
# frozen out of its way (pytest_collection_finish), it costs a quarter of that. Only
# this process: the processes the tests start keep Python's defaults.
gc.set_threshold(50_000, 20, 20)

pytest_plugins = ("pytester", "tests.cpumeter", "tests.parallel")

_TRUE = ("true", "1", "yes")


def in_ci() -> bool:
    """True when ``CI`` is set to true/1/yes (as ``.ci/run`` does)."""
    return os.environ.get("CI", "").strip().lower() in _TRUE


def missing_dependency(reason: str) -> None:
    """Skip the current test for ``reason``, or fail it under ``CI=true``. Never returns."""
    __tracebackhide__ = True  # report the caller's line, not this one
    if in_ci():
        pytest.fail(
            f"{reason} (CI=true: a missing dependency fails, it never skips)", pytrace=False
        )
    pytest.skip(reason)


def require(module: str, why: str = "") -> ModuleType:
    """Import and return ``module``; when it cannot be imported, skip (fail under CI=true)."""
    __tracebackhide__ = True
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        error = exc
    hint = f" ({why})" if why else ""
    missing_dependency(f"needs {module!r}{hint}: {error}")
    raise AssertionError("unreachable")  # missing_dependency always raises


def require_torch() -> ModuleType:
    """``torch``, or skip (fail under CI=true); the [torch] extra is part of ``make setup``."""
    __tracebackhide__ = True
    return require("torch", "install the [torch] extra: make setup")


def torch_installed() -> bool:
    """Whether torch is installed, found without importing it (~2 CPU-s per process)."""
    return importlib.util.find_spec("torch") is not None


def pytest_collection_finish(session: pytest.Session) -> None:
    """Freeze what collection built (it lives to the end of the run) out of the
    collector's way."""
    gc.collect()
    gc.freeze()


def pytest_runtest_setup(item: pytest.Item) -> None:
    # Most torch tests need torch in the processes they start, not in this one: the
    # marker imports it only when it is missing, for require_torch's skip or CI failure.
    if item.get_closest_marker("torch") is not None and not torch_installed():
        require_torch()


def _as_ci_failure(report: pytest.TestReport | pytest.CollectReport) -> None:
    """Turn a skipped report into a failed one (CI=true), keeping the skip's reason."""
    reason = "skipped"
    longrepr = report.longrepr
    if isinstance(longrepr, tuple) and len(longrepr) == 3:
        reason = str(longrepr[2]).removeprefix("Skipped: ")
    elif longrepr is not None:
        reason = str(longrepr)
    report.outcome = "failed"
    report.longrepr = f"CI=true: tests must run, not skip. Skip reason: {reason}"


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    outcome = yield
    report = outcome.get_result()
    if in_ci() and report.skipped and not hasattr(report, "wasxfail"):
        _as_ci_failure(report)


@pytest.hookimpl(hookwrapper=True)
def pytest_make_collect_report(collector: pytest.Collector) -> Iterator[None]:
    outcome = yield
    report = outcome.get_result()
    if in_ci() and report.skipped:
        _as_ci_failure(report)


#: What a launcher (torchrun, corral) sets for a rank: without them the SDK is one process.
LAUNCHER_ENV = (
    "RANK",
    "LOCAL_RANK",
    "WORLD_SIZE",
    "LOCAL_WORLD_SIZE",
    "NODE_RANK",
    "GROUP_RANK",
    "NNODES",
    "GROUP_WORLD_SIZE",
    "MASTER_ADDR",
    "MASTER_PORT",
)


@pytest.fixture
def clean_dist_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """No launcher or corral variable from the environment the tests run in."""
    for name in (*LAUNCHER_ENV, "CORRAL_JOB_ID", "CORRAL_ATTEMPT", "TORCHELASTIC_RESTART_COUNT"):
        monkeypatch.delenv(name, raising=False)
