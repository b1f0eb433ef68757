"""How the suite runs in parallel (pytest-xdist, ``-n N --dist loadgroup``; a plugin
loaded by tests/conftest.py).

- Work units. Every test that needs the netns testbed is in one group (``netns``), so
  one worker brings the machine's one testbed up, once, and runs them all in turn;
  a module with a module- or class-scoped fixture (a live server, a browser, a
  trained model) is one group, so that fixture is set up once; every other test is
  scheduled on its own. The netns group and the other groups are collected first:
  the longest units start first, and the single tests fill in around them.
- Isolation. Each worker gets its own ``HOME`` (and XDG data, config, cache, state and
  runtime dirs under it), so nothing that a test or a server writes to the user's
  home (corral's data dir and token, chromium's profile) is shared with a test on
  another worker. pytest already gives each worker its own ``tmp_path`` root; ports
  are picked free per test; the testbed's names and addresses are the machine's one
  set, which the netns group keeps to one worker.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from pathlib import Path

import pytest

NETNS_GROUP = "netns"
_WIDE_SCOPES = ("module", "class", "package")
_HOME_LINKS = (".gitconfig", ".pyenv")
"""Entries of the real home that a worker's home links to: git's identity, and
pyenv's interpreters (``python3`` on PATH may be a pyenv shim, which finds them
under ``$HOME/.pyenv`` unless ``PYENV_ROOT`` is set)."""


def _group(item: pytest.Item) -> str | None:
    """The xdist group of ``item``: ``netns``, its module's path, or None."""
    if item.get_closest_marker("netns") is not None:
        return NETNS_GROUP
    info = getattr(item, "_fixtureinfo", None)
    for defs in getattr(info, "name2fixturedefs", {}).values():
        if any(d.scope in _WIDE_SCOPES for d in defs):
            return item.nodeid.split("::", 1)[0]
    return None


@pytest.hookimpl(tryfirst=True)  # before xdist's own, which reads the groups
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if not _distributed(config):
        return
    groups: dict[int, str] = {}
    for index, item in enumerate(items):
        group = _group(item)
        if group is not None and item.get_closest_marker("xdist_group") is None:
            item.add_marker(pytest.mark.xdist_group(group))
            groups[index] = group
    netns = [item for i, item in enumerate(items) if groups.get(i) == NETNS_GROUP]
    grouped = [item for i, item in enumerate(items) if i in groups and groups[i] != NETNS_GROUP]
    single = [item for i, item in enumerate(items) if i not in groups]
    items[:] = netns + grouped + single


def _distributed(config: pytest.Config) -> bool:
    """True in an xdist worker, and in the controller of a distributed run."""
    if os.environ.get("PYTEST_XDIST_WORKER"):
        return True
    return (
        bool(getattr(config.option, "numprocesses", None))
        and config.getoption("dist", "no") != "no"
    )


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
        runtime = self.path / "run"
        runtime.mkdir(mode=0o700)
        os.environ["HOME"] = str(self.path)
        os.environ["XDG_DATA_HOME"] = str(self.path / ".local" / "share")
        os.environ["XDG_CONFIG_HOME"] = str(self.path / ".config")
        os.environ["XDG_CACHE_HOME"] = str(self.path / ".cache")
        os.environ["XDG_STATE_HOME"] = str(self.path / ".local" / "state")
        os.environ["XDG_RUNTIME_DIR"] = str(runtime)

    def close(self) -> None:
        shutil.rmtree(self.path, ignore_errors=True)


def pytest_configure(config: pytest.Config) -> None:
    worker = os.environ.get("PYTEST_XDIST_WORKER")
    if worker:
        config.pluginmanager.register(_HomeCleanup(WorkerHome(worker)), "corral-worker-home")


class _HomeCleanup:
    def __init__(self, home: WorkerHome) -> None:
        self.home = home

    def pytest_unconfigure(self, config: pytest.Config) -> None:
        self.home.close()
