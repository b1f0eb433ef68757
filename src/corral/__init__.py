"""corral: launch, check, watch and recover distributed training on machines you own.

The command line (``corral run|plan|exec|testbed ...``) is the main interface;
this package exposes the same building blocks for programs: parse a cluster,
plan a job (a dry run is just the plan), and run it under the supervisor.
Training scripts import :mod:`corral.sdk`.
"""

from __future__ import annotations

from corral.lazy import lazy_exports

TYPE_CHECKING = False  # not typing's: ``import corral`` starts every agent and rank

if TYPE_CHECKING:
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
    from corral.states import JobState, NodeState

# Names are imported on first use: the node agent, the rank wrapper and the SDK
# import ``corral.*`` submodules on every rank and must not pay for the CLI's
# dependencies (pydantic, yaml, rich, asyncssh).
_LAZY = {
    "Cluster": "corral.cluster",
    "Host": "corral.cluster",
    "load_cluster": "corral.cluster",
    "CheckFailed": "corral.errors",
    "CommandTimeout": "corral.errors",
    "ConfigError": "corral.errors",
    "ConnectError": "corral.errors",
    "ConnectionLost": "corral.errors",
    "CorralError": "corral.errors",
    "JobFailed": "corral.errors",
    "LaunchError": "corral.errors",
    "TransportError": "corral.errors",
    "plan_job": "corral.plan.render",
    "JobSpec": "corral.plan.spec",
    "NodeCommand": "corral.plan.spec",
    "RankProcess": "corral.plan.spec",
    "JobState": "corral.states",
    "NodeState": "corral.states",
}


__getattr__ = lazy_exports(__name__, _LAZY, globals())


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
