"""Actors: one coordinator program drives worker processes on every node.

```python
from corral.actors import Cluster, NCCLConfig, setup_nccl_env

def work(handle):                         # runs in every worker process
    config = NCCLConfig(**handle.recv())
    setup_nccl_env(config)                # then torch.distributed.init_process_group("gloo")
    handle.send({"status": "ready", "rank": config.rank})
    while (msg := handle.recv())["cmd"] != "shutdown":
        handle.send({"echo": msg["x"]})

if __name__ == "__main__":
    with Cluster.from_hosts("local:2", workers_per_host=2) as cluster:   # or "hosts.txt"
        workers = cluster.start(work, wait_time=30)
        for worker, config in zip(workers, cluster.nccl_configs()):
            worker.send(config.to_dict())
        print(cluster.gather(timeout=60))
        print(cluster.call({"cmd": "step", "x": 1}, timeout=60))
        cluster.broadcast({"cmd": "shutdown"})
```

Each worker is started with corral's transport (SSH, or local processes for
``local:N``) and talks to the coordinator over that session's stdin/stdout: no
port is opened and pickles only cross the authenticated channel. A worker that
dies makes ``recv`` raise :class:`WorkerDied` (host, rank, exit code or signal,
stderr tail); an exception in ``work_fn`` arrives as :class:`RemoteError` with the
remote traceback; a worker whose coordinator (or SSH connection) goes away kills
its whole process group. Worker output streams here as ``[host:rank]`` lines.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from corral.actors._cluster import Cluster, NodeConfig, Worker, WorkerHandle
    from corral.actors.errors import (
        ActorError,
        ActorGroupError,
        ActorStartError,
        ActorTimeout,
        RemoteError,
        WorkerDied,
        WorkerRestarted,
    )
    from corral.actors.nccl import NCCLConfig, create_nccl_configs, setup_nccl_env
    from corral.actors.worker import CoordinatorHandle, Stopped

# Imported on first use: a worker process imports this package and must stay light.
_LAZY = {
    "Cluster": "corral.actors._cluster",
    "NodeConfig": "corral.actors._cluster",
    "Worker": "corral.actors._cluster",
    "WorkerHandle": "corral.actors._cluster",
    "ActorError": "corral.actors.errors",
    "ActorGroupError": "corral.actors.errors",
    "ActorStartError": "corral.actors.errors",
    "ActorTimeout": "corral.actors.errors",
    "RemoteError": "corral.actors.errors",
    "WorkerDied": "corral.actors.errors",
    "WorkerRestarted": "corral.actors.errors",
    "NCCLConfig": "corral.actors.nccl",
    "create_nccl_configs": "corral.actors.nccl",
    "setup_nccl_env": "corral.actors.nccl",
    "CoordinatorHandle": "corral.actors.worker",
    "Stopped": "corral.actors.worker",
}
# The training backends (another module, needs torch) are reachable from here too.
_BACKENDS = ("DDPTrainingBackend", "FSDPTrainingBackend", "FSDPConfig")

__all__ = [
    "ActorError",
    "ActorGroupError",
    "ActorStartError",
    "ActorTimeout",
    "Cluster",
    "CoordinatorHandle",
    "NCCLConfig",
    "NodeConfig",
    "RemoteError",
    "Stopped",
    "Worker",
    "WorkerDied",
    "WorkerHandle",
    "WorkerRestarted",
    "create_nccl_configs",
    "setup_nccl_env",
]


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None and name in _BACKENDS:
        module = "corral.actors.backends"
    if module is None:
        raise AttributeError(f"module 'corral.actors' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted([*__all__, *globals()])
