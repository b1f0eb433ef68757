"""What the checks look at: the options, the cluster and every host's facts."""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass, field
from typing import Any

from corral.checks.gather import HostFacts
from corral.checks.reference import CodeReference
from corral.cluster.model import Cluster, Host
from corral.sync.fingerprint import Manifest
from corral.transport.options import SshOptions

DEFAULT_MIN_FREE_GB = 1.0
DEFAULT_SMOKE_TIMEOUT = 30.0


@dataclass
class ChecklistOptions:
    """Everything ``corral check`` (or ``corral run``'s pre-flight) was given."""

    cluster: Cluster
    ssh: SshOptions = field(default_factory=SshOptions)
    launcher: str = "torchrun"
    python: str | None = None
    workdir: str | None = None  # on the hosts; default: this machine's current directory
    # the code tree on this machine; default: see corral.checks.reference.resolve
    code_dir: str | None = None
    script: str | None = None
    master_addr: str | None = None
    master_port: int = 29500
    nproc_per_node: int | None = None
    nccl_interface: str | None = None
    gloo_interface: str | None = None
    checkpoint_dir: str | None = None
    min_free_gb: float = DEFAULT_MIN_FREE_GB
    consistency_threshold: float = 1.0
    exclude_divergent: bool = False
    extra_ignores: tuple[str, ...] = ()
    smoke: bool = True
    smoke_timeout: float = DEFAULT_SMOKE_TIMEOUT
    connect_timeout: float = 10.0
    sync: dict[str, Any] | None = None  # what `--sync` / `--sync-script` did in this run


@dataclass
class CheckContext:
    """The inputs of every check module."""

    options: ChecklistOptions
    cluster: Cluster
    master: Host
    master_addr: str
    workdir: str
    facts: dict[str, HostFacts]
    local_manifest: Manifest | None = None
    local_script_sha256: str | None = None
    reference: CodeReference | None = None  # which tree here the hosts must match
    ignores: tuple[str, ...] = ()  # extra ignores both sides' manifests were walked with

    @property
    def is_local(self) -> bool:
        """``local:N``: every node is this machine."""
        return self.cluster.is_local

    def answered(self) -> list[HostFacts]:
        """The hosts that answered, in cluster order."""
        return [self.facts[h.name] for h in self.cluster.hosts if self.facts[h.name].ok]

    def nproc(self, host: Host) -> int:
        """Ranks the job runs on ``host``."""
        return self.options.nproc_per_node or host.slots


def is_loopback(addr: str) -> bool:
    """Whether ``addr`` (a name or an IP) is a loopback address, without DNS."""
    if addr in ("localhost", "localhost.localdomain", "ip6-localhost"):
        return True
    try:
        return ipaddress.ip_address(addr).is_loopback
    except ValueError:
        return False
