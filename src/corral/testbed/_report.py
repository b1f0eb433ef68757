"""What a testbed reports: its hosts, their health (``corral testbed status``) and
what ``up`` and ``down`` did."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from corral.testbed._model import peer_ifname


@dataclass(frozen=True)
class TestbedHost:
    """One simulated host: ``name`` is its hostname and ssh alias."""

    __test__ = False

    name: str
    address: str
    netns: str
    veth: str

    @property
    def interface(self) -> str:
        """The host's network device inside its namespace (``nic-tbK``)."""
        return peer_ifname(self.name)


@dataclass(frozen=True)
class HostStatus:
    """Health of one host, as seen from the root namespace."""

    name: str
    address: str
    netns: bool
    holder: bool
    sshd: bool
    link_up: bool
    ssh_answers: bool

    @property
    def healthy(self) -> bool:
        """Everything in place and sshd answering."""
        return self.netns and self.holder and self.sshd and self.link_up and self.ssh_answers

    def problems(self) -> list[str]:
        """What is wrong with the host, in words."""
        out: list[str] = []
        if not self.netns:
            out.append("network namespace missing")
        if not self.holder:
            out.append("namespace holder process gone")
        if not self.sshd:
            out.append("sshd not running")
        if not self.link_up:
            out.append("link down")
        if self.sshd and self.link_up and not self.ssh_answers:
            out.append("sshd does not answer on port 22")
        return [f"{self.name}: {p}" for p in out]


@dataclass(frozen=True)
class TestbedStatus:
    """State of a testbed; ``exists`` is False when the state dir records none."""

    __test__ = False

    state_dir: str
    exists: bool
    phase: str = ""
    subnet: str = ""
    bridge: str = ""
    bridge_present: bool = False
    hosts: tuple[HostStatus, ...] = ()
    other_state_dir: str | None = None

    @property
    def healthy(self) -> bool:
        """Fully up: every host healthy and the bridge present."""
        return (
            self.exists
            and self.phase == "up"
            and self.bridge_present
            and all(h.healthy for h in self.hosts)
        )

    def problems(self) -> list[str]:
        """Everything wrong, one line each."""
        if not self.exists:
            return []
        out: list[str] = []
        if self.phase != "up":
            out.append("creation did not finish")
        if not self.bridge_present:
            out.append(f"bridge {self.bridge} missing")
        for h in self.hosts:
            out.extend(h.problems())
        return out

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form (``corral testbed status --json``)."""
        return {
            "state_dir": self.state_dir,
            "exists": self.exists,
            "healthy": self.healthy,
            "phase": self.phase,
            "subnet": self.subnet,
            "bridge": self.bridge,
            "bridge_present": self.bridge_present,
            "other_state_dir": self.other_state_dir,
            "problems": self.problems(),
            "hosts": [
                {
                    "name": h.name,
                    "address": h.address,
                    "healthy": h.healthy,
                    "netns": h.netns,
                    "holder": h.holder,
                    "sshd": h.sshd,
                    "link_up": h.link_up,
                    "ssh_answers": h.ssh_answers,
                }
                for h in self.hosts
            ],
        }


@dataclass(frozen=True)
class UpResult:
    """What ``up`` did: ``already_up`` when a healthy testbed was found and left as is."""

    state_dir: Path
    hosts: tuple[TestbedHost, ...]
    already_up: bool
    seconds: float


@dataclass(frozen=True)
class DownResult:
    """What ``down`` removed, one description each (empty when there was nothing)."""

    state_dir: Path
    removed: tuple[str, ...] = field(default_factory=tuple)


__all__ = ["DownResult", "HostStatus", "TestbedHost", "TestbedStatus", "UpResult"]
