"""corral: launch, check, watch and recover distributed training on machines you own.

The command line (``corral run|plan|exec|testbed ...``) is the main interface;
this package exposes the same building blocks for programs: parse a cluster,
plan a job (a dry run is just the plan), and run it under the supervisor.
Training scripts import :mod:`corral.sdk`.
"""

from __future__ import annotations

from corral.cluster import Cluster, Host, load_cluster
from corral.errors import (
    CheckFailed,
    CommandTimeout,
    ConfigError,
    ConnectError,
    ConnectionLost,
    CorralError,
    JobFailed,
    LaunchError,
    TransportError,
)
from corral.plan.render import plan_job
from corral.plan.spec import JobSpec, NodeCommand, RankProcess
from corral.runtime.states import JobState, NodeState

__version__ = "0.1.0"

__all__ = [
    "CheckFailed",
    "Cluster",
    "CommandTimeout",
    "ConfigError",
    "ConnectError",
    "ConnectionLost",
    "CorralError",
    "Host",
    "JobFailed",
    "JobSpec",
    "JobState",
    "LaunchError",
    "NodeCommand",
    "NodeState",
    "RankProcess",
    "TransportError",
    "__version__",
    "load_cluster",
    "plan_job",
]
