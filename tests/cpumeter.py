"""CPU seconds per test, child processes included (a pytest plugin, loaded by tests/conftest.py).

``--cpu-report=N`` prints, at the end of the run, the N tests that cost the most CPU
(setup, call and teardown, every process they started included) beside their wall
seconds, and the run's total CPU and wall time. ``--cpu-report-file=PATH`` writes every
test's figures as JSON (``{"tests": {nodeid: {"cpu": s, "wall": s}}, "total_cpu": s}``).

How it measures (cheap: two file reads per test):

- As root with a cgroup CPU accounting controller (v1 ``cpuacct`` or v2 ``cpu.stat``),
  each pytest process (the xdist controller, each worker) moves itself into a new cgroup
  nested in the one it runs in. Everything it starts inherits it, processes in new
  sessions, daemons (the testbed's sshd and the ranks it starts) and double-forked ones
  included, and the cgroup keeps counting the CPU of processes that have exited. The
  CPU of a test is the difference of the cgroup's usage before and after it, and the
  outermost cgroup's usage is the whole run (hierarchical accounting sums the workers').
  At the end the process moves back, with anything left in its group, and removes it.
- Elsewhere: this process's own CPU plus that of its waited-for children
  (``RUSAGE_SELF`` + ``RUSAGE_CHILDREN``), which misses processes nobody waited for
  (orphans, daemons); the report says which method it used.
"""

from __future__ import annotations

import contextlib
import json
import os
import resource
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

_V1_ROOTS = (Path("/sys/fs/cgroup/cpuacct"), Path("/sys/fs/cgroup/cpu,cpuacct"))
_V2_ROOTS = (Path("/sys/fs/cgroup"), Path("/sys/fs/cgroup/unified"))
_PREFIX = "corral-pytest-"
_PROP = "cpu_meter"


def _own_cgroup(kind: str) -> str | None:
    """This process's cgroup path in the ``cpuacct`` (v1) or unified (v2) hierarchy."""
    with contextlib.suppress(OSError):
        for line in Path("/proc/self/cgroup").read_text().splitlines():
            _, controllers, path = line.split(":", 2)
            names = controllers.split(",")
            if (kind == "v1" and "cpuacct" in names) or (kind == "v2" and controllers == ""):
                return path
    return None


class CgroupMeter:
    """A cgroup of this process (and all it starts) whose CPU usage is read in seconds."""

    method = "cgroup"

    def __init__(self) -> None:
        self.parent, self.usage_file = self._locate()
        self.path = self.parent / f"{_PREFIX}{os.getpid()}"
        self._sweep()
        self.path.mkdir()
        try:
            (self.path / "cgroup.procs").write_text(str(os.getpid()))
        except OSError:
            self.path.rmdir()
            raise
        # What this process spent before it moved (interpreter start, collection setup).
        self.before = _self_cpu()

    @staticmethod
    def _locate() -> tuple[Path, str]:
        if os.geteuid() != 0:
            raise OSError("not root: no cgroup of our own")
        for root in _V1_ROOTS:
            own = _own_cgroup("v1")
            if own is not None and (root / "cpuacct.usage").exists():
                return root / own.lstrip("/"), "cpuacct.usage"
        own = _own_cgroup("v2")
        for root in _V2_ROOTS:
            if own is not None and (root / "cgroup.procs").exists():
                parent = root / own.lstrip("/")
                if (parent / "cpu.stat").exists():
                    return parent, "cpu.stat"
        raise OSError("no cgroup CPU accounting (v1 cpuacct or v2 cpu.stat)")

    def _sweep(self) -> None:
        """Remove empty groups left by runs that died (their pid no longer exists)."""
        for old in self.parent.glob(f"{_PREFIX}*"):
            pid = old.name.removeprefix(_PREFIX)
            if pid.isdigit() and not Path(f"/proc/{pid}").exists():
                with contextlib.suppress(OSError):
                    old.rmdir()

    def read(self) -> float:
        """CPU seconds of every process that ever was in the group."""
        text = (self.path / self.usage_file).read_text()
        if self.usage_file == "cpuacct.usage":
            return int(text) / 1e9
        for line in text.splitlines():
            key, value = line.split()
            if key == "usage_usec":
                return int(value) / 1e6
        raise OSError(f"no usage_usec in {self.path / self.usage_file}")

    def total(self) -> float:
        """CPU seconds of this pytest process and everything it started."""
        return self.before + self.read()

    def close(self) -> None:
        """Move every process in the group back to the parent group; remove the group."""
        with contextlib.suppress(OSError):
            for pid in (self.path / "cgroup.procs").read_text().split():
                with contextlib.suppress(OSError):
                    (self.parent / "cgroup.procs").write_text(pid)
            self.path.rmdir()


def _self_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


class RusageMeter:
    """This process's CPU and that of the children it waited for (orphans are missed)."""

    method = "rusage (waited-for children only)"

    def read(self) -> float:
        own = resource.getrusage(resource.RUSAGE_SELF)
        kids = resource.getrusage(resource.RUSAGE_CHILDREN)
        return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime

    def total(self) -> float:
        return self.read()

    def close(self) -> None:
        pass


class CpuReport:
    """Per-test CPU/wall figures: measured where tests run, reported where they are shown."""

    def __init__(self, config: pytest.Config) -> None:
        self.config = config
        self.top: int = config.getoption("cpu_report")
        self.file: str | None = config.getoption("cpu_report_file")
        self.meter: CgroupMeter | RusageMeter
        try:
            self.meter = CgroupMeter()
        except OSError:
            self.meter = RusageMeter()
        self.wall_start = time.monotonic()
        self.tests: dict[str, tuple[float, float]] = {}
        self._start: tuple[float, float] | None = None

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_protocol(self, item: pytest.Item) -> Iterator[None]:
        self._start = (self.meter.read(), time.monotonic())
        yield
        self._start = None

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_makereport(
        self, item: pytest.Item, call: pytest.CallInfo[None]
    ) -> Iterator[None]:
        outcome = yield
        if call.when == "teardown" and self._start is not None:
            cpu = self.meter.read() - self._start[0]
            wall = time.monotonic() - self._start[1]
            outcome.get_result().user_properties.append((_PROP, (round(cpu, 3), round(wall, 3))))

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        if report.when != "teardown":
            return
        for name, value in report.user_properties:
            if name == _PROP:
                cpu, wall = value
                self.tests[report.nodeid] = (float(cpu), float(wall))

    def pytest_terminal_summary(self, terminalreporter: pytest.TerminalReporter) -> None:
        if hasattr(self.config, "workerinput"):
            return  # an xdist worker: the controller reports
        total = self.meter.total()
        wall = time.monotonic() - self.wall_start
        if self.file:
            data = {
                "method": self.meter.method,
                "total_cpu": round(total, 1),
                "wall": round(wall, 1),
                "tests": {k: {"cpu": c, "wall": w} for k, (c, w) in self.tests.items()},
            }
            Path(self.file).write_text(json.dumps(data, indent=1) + "\n")
        if not self.top:
            return
        write = terminalreporter.write_line
        terminalreporter.section(f"{self.top} costliest tests in CPU seconds")
        write(f"{'cpu s':>8} {'wall s':>8}  test")
        ranked = sorted(self.tests.items(), key=lambda kv: kv[1][0], reverse=True)
        for nodeid, (cpu, w) in ranked[: self.top]:
            write(f"{cpu:8.1f} {w:8.1f}  {nodeid}")
        in_tests = sum(c for c, _ in self.tests.values())
        write(
            f"CPU: {total:.0f} s ({total / 60:.1f} CPU-min) for the run, {in_tests:.0f} s in "
            f"{len(self.tests)} tests; wall {wall:.0f} s ({wall / 60:.1f} min); "
            f"measured by {self.meter.method}"
        )

    def pytest_unconfigure(self, config: pytest.Config) -> None:
        self.meter.close()


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("cpu", "CPU seconds per test")
    group.addoption(
        "--cpu-report",
        type=int,
        default=0,
        metavar="N",
        help="print the N tests that cost the most CPU (their processes included), and the total",
    )
    group.addoption(
        "--cpu-report-file",
        default=None,
        metavar="PATH",
        help="write every test's CPU and wall seconds as JSON to PATH",
    )


def pytest_configure(config: pytest.Config) -> None:
    config.pluginmanager.register(CpuReport(config), "corral-cpu-report")
