"""How the suite runs in parallel (pytest-xdist, ``-n N --dist loadgroup``; a plugin
loaded by tests/conftest.py).

- Work units. Every test that needs the netns testbed is in one group (``netns``), so
  one worker brings the machine's one testbed up, once, and runs them all in turn;
  a module with a module- or class-scoped fixture (a live server, a browser, a
  trained model) is one group, so that fixture is set up once; every other test is
  scheduled on its own. xdist starts the largest groups first (the netns group).
  The workers find the groups at collection (fixture scopes and markers are known
  there) and hand them to the controller's scheduler in a file: pytest 9's node ids
  no longer take the ``@group`` suffix that xdist's own ``xdist_group`` relies on.
- Isolation. Each worker gets its own ``HOME`` (and XDG data, config, cache and state
  dirs under it; ``XDG_RUNTIME_DIR`` is left as it is: the control sockets made there
  have random names), so nothing that a test or a server writes to the user's
  home (corral's data dir and token, chromium's profile) is shared with a test on
  another worker (the netns tests keep the real one: they have their worker to
  themselves). pytest already gives each worker its own ``tmp_path`` root; ports
  are picked free per test; the testbed's names and addresses are the machine's one
  set, which the netns group keeps to one worker.
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

try:
    from xdist.scheduler import LoadGroupScheduling
except ImportError:  # no pytest-xdist: nothing runs in parallel
    LoadGroupScheduling = object

NETNS_GROUP = "netns"
_WIDE_SCOPES = ("module", "class", "package")
_GROUPS_ENV = "CORRAL_TEST_GROUPS"
"""The directory where the workers write the groups they found (set by the controller)."""
_HOME_LINKS = (".gitconfig", ".pyenv")
"""Entries of the real home that a worker's home links to: git's identity, and
pyenv's interpreters (``python3`` on PATH may be a pyenv shim, which finds them
under ``$HOME/.pyenv`` unless ``PYENV_ROOT`` is set)."""


def _group(item: pytest.Item) -> str | None:
    """The group of ``item``: ``netns``, its module's path, or None (scheduled alone)."""
    if item.get_closest_marker("netns") is not None:
        return NETNS_GROUP
    marked = item.get_closest_marker("xdist_group")
    if marked is not None:
        return str(marked.args[0] if marked.args else marked.kwargs.get("name", "default"))
    info = getattr(item, "_fixtureinfo", None)
    for defs in getattr(info, "name2fixturedefs", {}).values():
        if any(d.scope in _WIDE_SCOPES for d in defs):
            return item.nodeid.split("::", 1)[0]
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
    groups = {item.nodeid: group for item in items if (group := _group(item)) is not None}
    tmp = Path(shared) / f".{worker}.tmp"
    tmp.write_text(json.dumps(groups))
    tmp.replace(Path(shared) / f"{worker}.json")  # every worker writes the same groups


class GroupScheduling(LoadGroupScheduling):  # type: ignore[misc]
    """xdist's ``loadgroup``, with the groups the workers found at collection."""

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
    testbed's hosts mount their own home and ``/tmp``, and the netns tests run one at
    a time on one worker, so a home of the worker's own buys them nothing."""
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
