"""How the suite runs in parallel (pytest-xdist, ``-n N --dist loadgroup``; a plugin
loaded by tests/conftest.py).

- Work units. The tests that need the netns testbed are split by module into
  ``NETNS_GROUPS`` groups (``netns-0``, ``netns-1``) of about equal known wall time
  (``NETNS_COST``), so two workers each bring up a testbed of their own, once, and
  run their half in turn; a module with a module- or class-scoped fixture (a live
  server, a browser, a trained model) is one group, so that fixture is set up once;
  every other test is scheduled on its own. The netns groups start first, one per
  worker (:class:`GroupScheduling`), then the largest groups.
  The workers find the groups at collection (fixture scopes and markers are known
  there) and hand them to the controller's scheduler in a file: pytest 9's node ids
  no longer take the ``@group`` suffix that xdist's own ``xdist_group`` relies on.
- Isolation. Each worker gets its own ``HOME`` (and XDG data, config, cache and state
  dirs under it; ``XDG_RUNTIME_DIR`` is left as it is: the control sockets made there
  have random names), so nothing that a test or a server writes to the user's
  home (corral's data dir and token, chromium's profile) is shared with a test on
  another worker (the netns tests keep the real one: they have their worker to
  themselves). pytest already gives each worker its own ``tmp_path`` root; ports
  are picked free per test. A worker's testbed is instance ``N`` of worker ``gwN``
  (:func:`worker_instance`; 0 without xdist): its own namespaces, bridge, subnet
  ``10.77.N.0/24``, state dir, registry and lock, with the same host names tb1..tbN
  (each host resolves them in its own ``/etc/hosts``, the tests through the
  testbed's ssh_config). The netns tests' ``HOME`` is the real one on every worker
  (the hosts have their own home; what corral keeps there is per job id).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

import pytest

from corral.testbed import MAX_INSTANCES

try:
    from xdist.scheduler import LoadGroupScheduling
except ImportError:  # no pytest-xdist: nothing runs in parallel
    LoadGroupScheduling = object

NETNS_GROUP = "netns"
"""Prefix of the netns groups' names: ``netns-0``, ``netns-1``, ..."""
NETNS_GROUPS = 2
"""How many workers share the netns tests, each with a testbed of its own."""
NETNS_COST = {
    "test_inplace_netns": 321,
    "test_faults": 166,
    "test_run_ssh": 71,
    "test_calibrate_netns": 60,
    "test_serve_netns": 49,
    "test_actors_netns": 46,
    "test_check": 43,
    "test_actors_example_netns": 35,
    "test_web_netns": 31,
    "test_launchers_netns": 28,
    "test_ssh_transport": 24,
    "test_exec": 21,
    "test_ping": 21,
    "test_smoke_testbed": 21,
    "test_links_netns": 20,
    "test_capabilities_netns": 12,
    "test_checkpoints": 9,
    "test_links_api_netns": 7,
    "test_sync": 7,
    "test_shared_data_netns": 6,
    "test_testbed": 6,
    "test_mlx_netns": 4,
    "test_remote_python": 1,
}
"""Wall seconds of each netns test module (``--cpu-report-file`` of ``pytest -n 2 --dist
loadgroup tests/integration/netns``, 2026-11-28); a module not listed counts
``_NETNS_DEFAULT_COST``."""
_NETNS_DEFAULT_COST = 20
_WIDE_SCOPES = ("module", "class", "package")
_GROUPS_ENV = "CORRAL_TEST_GROUPS"
"""The directory where the workers write the groups they found (set by the controller)."""
_HOME_LINKS = (".gitconfig", ".pyenv")
"""Entries of the real home that a worker's home links to: git's identity, and
pyenv's interpreters (``python3`` on PATH may be a pyenv shim, which finds them
under ``$HOME/.pyenv`` unless ``PYENV_ROOT`` is set)."""


def netns_groups(modules: list[str], groups: int = NETNS_GROUPS) -> dict[str, str]:
    """``{module path: netns-K}``: the modules dealt out, costliest first, each to the
    group with the least known wall time so far (ties: the lower K, then by name, so
    every worker finds the same groups)."""
    load = [0] * groups
    found: dict[str, str] = {}
    for module in sorted(set(modules), key=lambda m: (-_cost(m), m)):
        k = load.index(min(load))
        load[k] += _cost(module)
        found[module] = f"{NETNS_GROUP}-{k}"
    return found


def _cost(module: str) -> int:
    return NETNS_COST.get(Path(module).stem, _NETNS_DEFAULT_COST)


def worker_instance() -> int:
    """The testbed instance of this process: ``N`` on xdist worker ``gwN``, else 0."""
    worker = os.environ.get("PYTEST_XDIST_WORKER", "")
    digits = worker.removeprefix("gw")
    return int(digits) % MAX_INSTANCES if digits.isdigit() else 0


def _module(item: pytest.Item) -> str:
    return item.nodeid.split("::", 1)[0]


def _group(item: pytest.Item, netns: dict[str, str]) -> str | None:
    """The group of ``item``: its netns group, its module's path, or None (alone)."""
    if item.get_closest_marker("netns") is not None:
        return netns[_module(item)]
    marked = item.get_closest_marker("xdist_group")
    if marked is not None:
        return str(marked.args[0] if marked.args else marked.kwargs.get("name", "default"))
    info = getattr(item, "_fixtureinfo", None)
    for defs in getattr(info, "name2fixturedefs", {}).values():
        if any(d.scope in _WIDE_SCOPES for d in defs):
            return _module(item)
    return None


def _worker(config: pytest.Config) -> str | None:
    """The xdist worker id of this run (None: not a worker, e.g. a pytester run in one)."""
    info = getattr(config, "workerinput", None)
    return str(info["workerid"]) if isinstance(info, dict) else None


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    worker = _worker(config)
    shared = os.environ.get(_GROUPS_ENV)
    if not worker or not shared:
        return
    netns = netns_groups([_module(i) for i in items if i.get_closest_marker("netns") is not None])
    groups = {i.nodeid: group for i in items if (group := _group(i, netns)) is not None}
    tmp = Path(shared) / f".{worker}.tmp"
    tmp.write_text(json.dumps(groups))
    tmp.replace(Path(shared) / f"{worker}.json")  # every worker writes the same groups


class GroupScheduling(LoadGroupScheduling):  # type: ignore[misc]
    """xdist's ``loadgroup``, with the groups the workers found at collection, the
    netns groups handed out first: their chains are the run's longest, and each must
    start at once on a worker of its own (xdist would order them by test count, and
    could give a worker that ran out of work both)."""

    def __init__(self, config: pytest.Config, log: Any = None) -> None:
        super().__init__(config, log)
        self._groups: dict[str, str] | None = None

    def _split_scope(self, nodeid: str) -> str:
        if "@" in nodeid:  # an xdist that could suffix the id
            return str(super()._split_scope(nodeid))
        if self._groups is None:
            found = sorted(Path(os.environ[_GROUPS_ENV]).glob("*.json"))
            self._groups = json.loads(found[0].read_text()) if found else {}
        return self._groups.get(nodeid, nodeid)

    def _assign_work_unit(self, node: Any) -> None:
        netns = next((s for s in self.workqueue if s.startswith(f"{NETNS_GROUP}-")), None)
        if netns is not None:
            self.workqueue.move_to_end(netns, last=False)
        super()._assign_work_unit(node)


@pytest.hookimpl(tryfirst=True, optionalhook=True)  # an xdist hook: absent with -p no:xdist
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> GroupScheduling | None:
    if config.getvalue("dist") != "loadgroup" or not os.environ.get(_GROUPS_ENV):
        return None
    return GroupScheduling(config, log)


class WorkerHome:
    """A fresh ``HOME`` (with XDG dirs under it) for one xdist worker, removed at exit."""

    def __init__(self, worker: str) -> None:
        real = Path.home()
        self.path = Path(tempfile.mkdtemp(prefix=f"corral-test-home-{worker}-"))
        for name in _HOME_LINKS:
            if (real / name).exists():
                with contextlib.suppress(OSError):
                    (self.path / name).symlink_to(real / name)
        if (real / ".pyenv").is_dir():
            os.environ.setdefault("PYENV_ROOT", str(real / ".pyenv"))
        ours = {
            "HOME": self.path,
            "XDG_DATA_HOME": self.path / ".local" / "share",
            "XDG_CONFIG_HOME": self.path / ".config",
            "XDG_CACHE_HOME": self.path / ".cache",
            "XDG_STATE_HOME": self.path / ".local" / "state",
        }
        self.real = {name: os.environ.get(name) for name in ours}
        os.environ.update({name: str(path) for name, path in ours.items()})

    def close(self) -> None:
        shutil.rmtree(self.path, ignore_errors=True)


_home: WorkerHome | None = None


@pytest.fixture(autouse=True)
def _netns_tests_keep_the_real_home(
    request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A netns test sees the user's own ``HOME`` and XDG dirs, as when run alone: the
    testbed's hosts mount their own home and ``/tmp`` (a worker's home under ``/tmp``
    is not there on them), and what corral keeps in the home is per job id."""
    if _home is None or request.node.get_closest_marker("netns") is None:
        return
    for name, value in _home.real.items():
        if value is None:
            monkeypatch.delenv(name, raising=False)
        else:
            monkeypatch.setenv(name, value)


class _Cleanup:
    def __init__(self, path: Path | WorkerHome) -> None:
        self.path = path

    def pytest_unconfigure(self, config: pytest.Config) -> None:
        if isinstance(self.path, WorkerHome):
            self.path.close()
        else:
            os.environ.pop(_GROUPS_ENV, None)
            shutil.rmtree(self.path, ignore_errors=True)


def pytest_configure(config: pytest.Config) -> None:
    global _home
    worker = _worker(config)
    if worker:
        _home = WorkerHome(worker)
        config.pluginmanager.register(_Cleanup(_home), "corral-worker-home")
    elif getattr(config.option, "numprocesses", None) and config.getvalue("dist") == "loadgroup":
        # the controller, before it starts the workers (they inherit the variable)
        shared = Path(tempfile.mkdtemp(prefix="corral-test-groups-"))
        os.environ[_GROUPS_ENV] = str(shared)
        config.pluginmanager.register(_Cleanup(shared), "corral-test-groups")
