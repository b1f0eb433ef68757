"""Host and Cluster: frozen, I/O-free descriptions of where a job runs."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

LOCAL_ADDRESS = "127.0.0.1"


def _frozen(mapping: Mapping[str, str] | None) -> Mapping[str, str]:
    return MappingProxyType(dict(mapping or {}))


@dataclass(frozen=True)
class Host:
    """One node of a cluster.

    ``name`` is how the user refers to the host (hostfile entry, ssh alias) and
    what log prefixes show; ``address`` is what other nodes connect to (defaults
    to ``name``). ``local`` marks a simulated node of ``local:N`` that runs as a
    process tree on the coordinator.
    """

    name: str
    address: str = ""
    slots: int = 1
    port: int | None = None
    user: str | None = None
    env: Mapping[str, str] = field(default_factory=dict)
    interface: str | None = None
    labels: Mapping[str, str] = field(default_factory=dict)
    local: bool = False
    python: str | None = None  # interpreter on the host, once resolved

    def __post_init__(self) -> None:
        if not self.address:
            object.__setattr__(self, "address", LOCAL_ADDRESS if self.local else self.name)
        object.__setattr__(self, "env", _frozen(self.env))
        object.__setattr__(self, "labels", _frozen(self.labels))

    def __hash__(self) -> int:
        return hash((self.name, self.address, self.slots, self.port, self.user, self.local))


@dataclass(frozen=True)
class Cluster:
    """An ordered set of hosts; the first host is node 0 (the master by default)."""

    hosts: tuple[Host, ...]
    source: str = ""

    def __post_init__(self) -> None:
        object.__setattr__(self, "hosts", tuple(self.hosts))

    @property
    def size(self) -> int:
        """Number of nodes."""
        return len(self.hosts)

    @property
    def total_slots(self) -> int:
        """Sum of slots over all hosts."""
        return sum(h.slots for h in self.hosts)

    @property
    def is_local(self) -> bool:
        """True when every node is a simulated local node (``local:N``)."""
        return all(h.local for h in self.hosts)

    def host(self, name: str) -> Host:
        """The host called ``name`` (KeyError if absent)."""
        for h in self.hosts:
            if h.name == name:
                return h
        raise KeyError(name)

    def __iter__(self) -> Iterator[Host]:
        return iter(self.hosts)

    def __len__(self) -> int:
        return len(self.hosts)
