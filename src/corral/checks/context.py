"""What the checks look at: the options, the cluster and every host's facts."""

from __future__ import annotations

import ipaddress
import os
import shlex
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from corral.agent.fingerprint import Manifest
from corral.checks.gather import HostFacts
from corral.checks.reference import CodeReference
from corral.checks.shared_probe import SharedProbe
from corral.cluster.model import Cluster, Host
from corral.defaults import DEFAULT_CONNECT_TIMEOUT, DEFAULT_FT_JOIN_TIMEOUT, DEFAULT_MASTER_PORT
from corral.defaults import DEFAULT_LINKS_MIN_RATIO as DEFAULT_LINKS_MIN_RATIO
from corral.defaults import DEFAULT_MIN_FREE_GB as DEFAULT_MIN_FREE_GB
from corral.recovery.health import DEFAULT_HOST_TIMEOUT
from corral.transport.options import SshOptions

DEFAULT_SMOKE_TIMEOUT = 30.0
DEFAULT_LINKS_SECONDS = 12.0


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
    master_port: int = DEFAULT_MASTER_PORT
    nproc_per_node: int | None = None
    # the ranks' collective backend as the job declares it (CORRAL_BACKEND): nccl, gloo
    # or None (not declared); see corral.diagnose.gpu.job_backend
    backend: str | None = None
    nccl_interface: str | None = None
    gloo_interface: str | None = None
    checkpoint_dir: str | None = None
    min_free_gb: float = DEFAULT_MIN_FREE_GB
    consistency_threshold: float = 1.0
    exclude_divergent: bool = False
    extra_ignores: tuple[str, ...] = ()
    smoke: bool = True
    smoke_timeout: float = DEFAULT_SMOKE_TIMEOUT
    connect_timeout: float = DEFAULT_CONNECT_TIMEOUT
    sync: dict[str, Any] | None = None  # what `--sync` / `--sync-script` did in this run
    job_id: str | None = None  # the job this pre-flight is for: its processes are not stale
    # this job's run dir (absolute): a local leftover whose node dir is under another
    # belongs to another corral installation (named as such, never to be killed)
    run_dir: str | None = None
    shared_data_path: str | None = None  # must be one filesystem on every host (seed 003)
    harness: bool = False  # --harness: Accelerate must be there whatever the launcher
    command_template: str | None = None  # --launcher command: its first word is looked for
    torchft: bool = False  # --recovery in-place: torchft must be importable on every host
    # --spares: hosts held in reserve, judged by the spares check (corral.checks.spares)
    spares: tuple[Host, ...] = ()
    # --recovery in-place: the timeouts whose order decides a lost node's fate
    # (corral.checks.timeouts): the job's env (torchft's overrides) and its options
    env: dict[str, str] = field(default_factory=dict)
    hang_timeout: float | None = None
    host_timeout: float = DEFAULT_HOST_TIMEOUT
    ft_join_timeout: float = DEFAULT_FT_JOIN_TIMEOUT  # the Lighthouse's (--ft-join-timeout)
    links: bool = False  # the link matrix (corral.checks.links)
    links_min_ratio: float = DEFAULT_LINKS_MIN_RATIO  # slow below this x the reference
    links_min_gbs: float = 0.0  # slow below this many GB/s (0: no floor)
    links_fail: bool = True  # a culprit fails the check (else it warns)
    links_seconds: float = DEFAULT_LINKS_SECONDS  # measurement budget, all pairs together


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
    shared_data: SharedProbe | None = None  # the hosts' answers about --shared-data-path

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

    def ssh(self, host: Host, command: Sequence[str], *, verbose: bool = False) -> str:
        """The ``ssh`` command line that runs ``command`` on ``host`` (see :func:`ssh_command`)."""
        return ssh_command(self.options.ssh, host, command, verbose=verbose)


def validate_links(min_ratio: float, min_gbs: float, seconds: float = 1.0) -> None:
    """ConfigError naming the option for a links setting out of range."""
    from corral.errors import ConfigError

    if not 0.0 <= min_ratio < 1.0:
        raise ConfigError(f"must be in [0, 1) (got {min_ratio:g})", option="--links-min-ratio")
    if not 0.0 <= min_gbs < float("inf"):
        raise ConfigError(f"must be >= 0 (got {min_gbs:g})", option="--links-min-gbs")
    if not 0.0 < seconds <= 600.0:
        raise ConfigError(f"must be in (0, 600] (got {seconds:g})", option="--links-seconds")


def cli_ssh_options(options: SshOptions) -> list[str]:
    """The CLUSTER options a printed ``corral ...`` command needs to reach the hosts
    the same way (never a secret: ``--ssh-password-env`` names a variable)."""
    words: list[str] = []
    for flag, value in (
        ("--ssh-config", options.config),
        ("--ssh-user", options.user),
        ("--ssh-port", str(options.port) if options.port else None),
        ("--ssh-key", options.key),
        ("--ssh-password-env", options.password_env),
    ):
        if value:
            words += [flag, value]
    if options.accept_new_host_keys:
        words.append("--accept-new-host-keys")
    if options.insecure_no_host_key_check:
        words.append("--insecure-no-host-key-check")
    return words


def ssh_command(
    options: SshOptions, host: Host, command: Sequence[str], *, verbose: bool = False
) -> str:
    """The ``ssh`` command a user types to run ``command`` on ``host`` the way corral
    reaches it: the ssh config (``-F``), port, user and key given; the host's name,
    or its hostfile address when that differs and no ssh config is given."""
    words = ["ssh", *(["-v"] if verbose else [])]
    if options.config:
        words += ["-F", os.path.expanduser(options.config)]
    port = host.port or options.port
    if port:
        words += ["-p", str(port)]
    user = host.user or options.user
    if user:
        words += ["-l", user]
    if options.key:
        words += ["-i", os.path.expanduser(options.key)]
    target = host.name if options.config or host.address in ("", host.name) else host.address
    return shlex.join([*words, target, *command])


def is_loopback(addr: str) -> bool:
    """Whether ``addr`` (a name or an IP) is a loopback address, without DNS."""
    if addr in ("localhost", "localhost.localdomain", "ip6-localhost"):
        return True
    try:
        return ipaddress.ip_address(addr).is_loopback
    except ValueError:
        return False
