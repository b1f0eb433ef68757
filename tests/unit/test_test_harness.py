"""The suite's own plugins: CPU seconds per test (tests/cpumeter.py) and the parallel
run's groups and per-worker homes (tests/parallel.py), each run in a real inner pytest."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

# The installed plugins the inner runs' tests do not use: hypothesis's and
# schemathesis's load ~0.7 CPU-s of imports into each of an inner run's processes.
UNUSED = ("-p", "no:hypothesispytest", "-p", "no:schemathesis")

# A busy loop of ``seconds`` CPU seconds, as a program for ``python -c``.
BURN = "import time\nwhile time.process_time() < {seconds}: pass\n"

CPU_TESTS = f"""
import subprocess, sys, time
from pathlib import Path

def test_burns_in_a_child():
    subprocess.run([sys.executable, "-c", {BURN.format(seconds=0.6)!r}], check=True)

def test_burns_in_an_orphan(tmp_path):
    # sh starts the burner in the background and exits at once: nobody waits for it
    done = tmp_path / "done"
    code = {BURN.format(seconds=0.6)!r} + f"open({{str(done)!r}}, 'w').close()\\n"
    subprocess.run(["sh", "-c", f'"{{sys.executable}}" -c "$0" &', code], check=True)
    while not done.exists():
        time.sleep(0.05)

def test_waits():
    time.sleep(0.4)
"""


def _inner(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, *args: str) -> Path:
    """Run pytest in a subprocess with the plugins; the figures it wrote as JSON."""
    monkeypatch.setenv("PYTHONPATH", str(REPO))
    out = pytester.path / "cpu.json"
    result = pytester.runpytest_subprocess(
        "-p", "tests.cpumeter", "-p", "tests.parallel", "-p", "no:cacheprovider", *UNUSED,
        "--cpu-report=3", f"--cpu-report-file={out}", *args,
    )  # fmt: skip
    assert result.ret == 0, result.stdout.str()
    result.stdout.fnmatch_lines(
        ["*3 costliest tests in CPU seconds*", "CPU: * s (* CPU-min) for the run, * s in * tests*"]
    )
    return out


Figures = tuple[dict[str, dict[str, float]], dict[str, object]]


def _figures(path: Path) -> Figures:
    data = json.loads(path.read_text())
    tests = {nodeid.split("::")[-1].split("@")[0]: v for nodeid, v in data["tests"].items()}
    return tests, data


@pytest.fixture(scope="module")
def cpu_runs() -> dict[str, Figures]:
    """The inner run of CPU_TESTS, made by the first test that needs it and read by
    both (it burns ~2 CPU-s; each test asserts on its own figures of it)."""
    return {}


def _cpu_figures(
    runs: dict[str, Figures], pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> Figures:
    if "cpu" not in runs:
        pytester.makepyfile(test_cpu=CPU_TESTS)
        runs["cpu"] = _figures(_inner(pytester, monkeypatch))
    return runs["cpu"]


def test_cpu_of_each_test_counts_its_child_processes(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, cpu_runs: dict[str, Figures]
) -> None:
    tests, data = _cpu_figures(cpu_runs, pytester, monkeypatch)
    assert tests["test_burns_in_a_child"]["cpu"] >= 0.5, data
    assert tests["test_waits"]["cpu"] < 0.3 and tests["test_waits"]["wall"] >= 0.4, data
    total = data["total_cpu"]
    assert isinstance(total, float) and total >= sum(t["cpu"] for t in tests.values()), data


@pytest.mark.skipif(os.geteuid() != 0, reason="a cgroup of its own needs root")
def test_cpu_of_processes_nobody_waits_for_is_counted_as_root(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, cpu_runs: dict[str, Figures]
) -> None:
    tests, data = _cpu_figures(cpu_runs, pytester, monkeypatch)
    assert data["method"] == "cgroup", data
    assert tests["test_burns_in_an_orphan"]["cpu"] >= 0.5, data
    # the inner run's group is removed at its end: every group left is a live run's
    groups = Path("/sys/fs/cgroup/cpuacct").rglob("corral-pytest-*")
    assert all(Path("/proc", g.name.removeprefix("corral-pytest-")).exists() for g in groups)


PARALLEL_TESTS = """
import os, time
from pathlib import Path
import pytest

OUT = Path(os.environ["HARNESS_OUT"])

def record(kind):
    worker = os.environ.get("PYTEST_XDIST_WORKER", "-")
    with open(OUT / f"{kind}-{worker}-{os.getpid()}", "w") as fh:
        fh.write(os.environ["HOME"])
    time.sleep(0.2)

@pytest.fixture(scope="module")
def once():
    record("fixture")

@pytest.mark.netns
@pytest.mark.parametrize("n", range(4))
def test_testbed(n):
    record("netns")

@pytest.mark.parametrize("n", range(4))
def test_shared(n, once):
    record("shared")

@pytest.mark.parametrize("n", range(8))
def test_single(n):
    record("single")
"""


def test_parallel_run_keeps_testbed_and_module_fixtures_on_one_worker_each_home_its_own(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    out = pytester.mkdir("records")
    monkeypatch.setenv("HARNESS_OUT", str(out))
    pytester.makepyfile(test_par=PARALLEL_TESTS)
    figures, _ = _figures(_inner(pytester, monkeypatch, "-n", "2", "--dist", "loadgroup"))
    assert len(figures) == 4 + 4 + 8
    records = {p.name: p.read_text() for p in out.iterdir()}
    workers = {name.split("-")[1] for name in records if name.startswith("single")}
    assert {name.split("-")[1] for name in records if name.startswith("netns")} <= workers
    assert len({n.split("-")[1] for n in records if n.startswith("netns")}) == 1, records
    assert len({n.split("-")[1] for n in records if n.startswith("shared")}) == 1, records
    assert len([n for n in records if n.startswith("fixture")]) == 1, records
    homes = {n.split("-")[1]: home for n, home in records.items() if not n.startswith("netns")}
    for worker, home in homes.items():
        assert worker in Path(home).name and home != os.environ["HOME"], homes
        assert not Path(home).exists(), "a worker's home is removed when it ends"
    assert len(set(homes.values())) == len(homes)
    # the netns tests keep the real home (the testbed's hosts mount their own)
    assert {h for n, h in records.items() if n.startswith("netns")} == {os.environ["HOME"]}


def test_plugins_leave_a_plain_run_alone(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    out = pytester.mkdir("records")
    monkeypatch.setenv("HARNESS_OUT", str(out))
    pytester.makepyfile(test_par=PARALLEL_TESTS)
    _inner(pytester, monkeypatch)
    homes = {p.read_text() for p in out.iterdir()}
    assert homes == {os.environ["HOME"]}, homes


def test_plugins_load_without_xdist(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``-p no:xdist`` (a debugging run in one process) still works: the scheduler hook
    is xdist's, so pluggy must not refuse it as unknown."""
    out = pytester.mkdir("records")
    monkeypatch.setenv("HARNESS_OUT", str(out))
    pytester.makepyfile(test_par=PARALLEL_TESTS)
    _inner(pytester, monkeypatch, "-p", "no:xdist")
    assert {p.name.split("-")[0] for p in out.iterdir()} == {"fixture", "netns", "shared", "single"}
