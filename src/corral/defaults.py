"""Defaults of a job's options that the layers below the engine apply too (the
pre-flight, host health, the SDK on the ranks), each written once.

A leaf (no import): the job description (:mod:`corral.job.describe`), the checks
(:mod:`corral.checks.context`) and host health (:mod:`corral.recovery.health`)
read them from here, so loading a description loads none of those layers.
"""

from __future__ import annotations

DEFAULT_MIN_FREE_GB = 1.0
"""``--min-free-gb``: free disk space the pre-flight asks of each host's workdir."""
DEFAULT_LINKS_MIN_RATIO = 0.3
"""``--links-min-ratio``: a link slower than this times the reference is slow."""
DEFAULT_HOST_TIMEOUT = 20.0
"""``--host-timeout``: seconds without any frame from a host's agent before it is lost."""

DEFAULT_MASTER_PORT = 29500
"""The port torch.distributed uses by default: the one fixed port where every node must
know it before any starts (Kubernetes pods, actors on SSH hosts), and what the SDK
reports when ``MASTER_PORT`` is unset. ``--master-port 0`` (the default) picks a free one."""
DEFAULT_CONNECT_TIMEOUT = 10.0
"""``--connect-timeout``: seconds an SSH connection (agent, rsync) may take to open."""

DEFAULT_GRACE = 10.0
"""``--grace``: seconds between SIGTERM and SIGKILL when a job is torn down."""
DEFAULT_COLLECTIVE_TIMEOUT = 1800.0
"""``--collective-timeout``: seconds the process group may wait to form and in any one
collective (PyTorch's own default; the Kubernetes and Slurm renders had it already)."""
DEFAULT_FT_JOIN_TIMEOUT = 10.0
"""``--ft-join-timeout``: seconds torchft's Lighthouse waits for a heartbeating replica group
that has not asked for the next quorum yet (it must exceed a step; torchft's own is 60)."""

__all__ = [
    "DEFAULT_COLLECTIVE_TIMEOUT",
    "DEFAULT_CONNECT_TIMEOUT",
    "DEFAULT_FT_JOIN_TIMEOUT",
    "DEFAULT_GRACE",
    "DEFAULT_HOST_TIMEOUT",
    "DEFAULT_LINKS_MIN_RATIO",
    "DEFAULT_MASTER_PORT",
    "DEFAULT_MIN_FREE_GB",
]
