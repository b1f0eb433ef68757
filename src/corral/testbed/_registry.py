"""The machine-wide side of testbeds: the registry of each instance
(``/run/corral/testbed.json`` for instance 0, ``testbed-I.json`` for instance ``I``:
which state dir owns that instance's one testbed), the lock per instance that test
sessions take turns with, and the check that nothing of another testbed is in the way."""

from __future__ import annotations

import contextlib
import fcntl
import ipaddress
import json
import os
from collections.abc import Iterator
from pathlib import Path

from corral.errors import ConfigError, LaunchError
from corral.testbed import _system as sysx
from corral.testbed._model import MAX_INSTANCES, InstanceNames, TestbedState

REGISTRY = sysx.RUN_DIR / "testbed.json"
"""The registry of instance 0 (:func:`registry_path` for any instance)."""
EXCLUSIVE_LOCK = Path("/tmp/corral-testbed.lock")
"""The lock of instance 0 (:func:`lock_path` for any instance)."""


def registry_path(instance: int = 0) -> Path:
    """Where the testbed of ``instance`` is registered."""
    tag = "" if InstanceNames(instance).instance == 0 else f"-{instance}"
    return REGISTRY.with_name(f"testbed{tag}.json")


def lock_path(instance: int = 0) -> Path:
    """The lock that sessions using testbed ``instance`` take turns with."""
    tag = "" if InstanceNames(instance).instance == 0 else f"-{instance}"
    return EXCLUSIVE_LOCK.with_name(f"corral-testbed{tag}.lock")


@contextlib.contextmanager
def exclusive(instance: int = 0, *, wait: bool = True) -> Iterator[bool]:
    """Hold testbed ``instance``'s lock for the block: test sessions and benchmarks
    that each bring up a testbed of that instance take turns (the block waits while
    another holder has it). With ``wait=False`` the block runs at once and gets
    False when someone else holds the lock (True when the block holds it)."""
    with open(lock_path(instance), "a") as fh:
        try:
            fcntl.flock(fh, fcntl.LOCK_EX | (0 if wait else fcntl.LOCK_NB))
        except BlockingIOError:
            yield False
            return
        try:
            yield True
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def read_registry(instance: int = 0) -> TestbedState | None:
    """The testbed the registry of ``instance`` records (None: none, or unreadable)."""
    try:
        return TestbedState.from_json(registry_path(instance).read_text())
    except (OSError, ConfigError):
        return None


def registered() -> list[TestbedState]:
    """Every testbed this machine's registries record (any instance), by instance."""
    found = [
        state
        for instance in range(MAX_INSTANCES)
        if registry_path(instance).exists() and (state := read_registry(instance)) is not None
    ]
    return found


def check_free(state: TestbedState) -> None:
    """Refuse to create over names or routes that exist without a testbed record."""
    taken = [f"bridge {state.bridge}"] if sysx.link_exists(state.bridge) else []
    taken += [f"link {h.veth}" for h in state.hosts if sysx.link_exists(h.veth)]
    taken += [f"netns {h.netns}" for h in state.hosts if sysx.netns_inode(h.netns) is not None]
    prefix = InstanceNames(state.instance).netns_prefix
    with contextlib.suppress(OSError):
        taken += [
            f"netns {name}"
            for name in os.listdir(sysx.NETNS_DIR)
            if name.startswith(prefix) and f"netns {name}" not in taken
        ]
    if taken:
        fixes = []
        for t in taken:
            kind, name = t.split(" ", 1)
            fixes.append(f"ip netns del {name}" if kind == "netns" else f"ip link del {name}")
        raise LaunchError(
            f"{', '.join(taken)} already exist but no testbed state records them (left over "
            f"from a crashed run?); check and remove them with: {'; '.join(fixes)}"
        )
    net = ipaddress.ip_network(state.subnet)
    routes = json.loads(sysx.run([sysx.tool("ip"), "-4", "-j", "route", "show"]) or "[]")
    for r in routes:
        dst = str(r.get("dst", "default"))
        if dst == "default":
            continue
        with contextlib.suppress(ValueError):
            if ipaddress.ip_network(dst, strict=False).overlaps(net):
                raise ConfigError(
                    f"{state.subnet} overlaps the existing route {dst} dev {r.get('dev')}; "
                    "choose another --subnet",
                    option="--subnet",
                )


__all__ = [
    "EXCLUSIVE_LOCK",
    "REGISTRY",
    "check_free",
    "exclusive",
    "lock_path",
    "read_registry",
    "registered",
    "registry_path",
]
