"""The machine-wide side of a testbed: the registry (``/run/corral/testbed.json``,
which state dir owns the one testbed this machine may have), the lock test sessions
take turns with, and the check that nothing of another testbed is in the way."""

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
from corral.testbed._model import NETNS_PREFIX, TestbedState

REGISTRY = sysx.RUN_DIR / "testbed.json"
EXCLUSIVE_LOCK = Path("/tmp/corral-testbed.lock")


@contextlib.contextmanager
def exclusive() -> Iterator[None]:
    """Hold the machine-wide testbed lock for the block (blocks while another holder
    has it): test sessions and benchmarks that each bring up a testbed take turns."""
    with open(EXCLUSIVE_LOCK, "a") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def read_registry() -> TestbedState | None:
    """The testbed this machine's registry records (None: none, or unreadable)."""
    try:
        return TestbedState.from_json(REGISTRY.read_text())
    except (OSError, ConfigError):
        return None


def check_free(state: TestbedState) -> None:
    """Refuse to create over names or routes that exist without a testbed record."""
    taken = [f"bridge {state.bridge}"] if sysx.link_exists(state.bridge) else []
    taken += [f"link {h.veth}" for h in state.hosts if sysx.link_exists(h.veth)]
    taken += [f"netns {h.netns}" for h in state.hosts if sysx.netns_inode(h.netns) is not None]
    with contextlib.suppress(OSError):
        taken += [
            f"netns {name}"
            for name in os.listdir(sysx.NETNS_DIR)
            if name.startswith(NETNS_PREFIX) and f"netns {name}" not in taken
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


__all__ = ["EXCLUSIVE_LOCK", "REGISTRY", "check_free", "exclusive", "read_registry"]
