"""JobSpec (what the user asked for) and NodeCommand (what one node runs)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, ClassVar, Literal

from corral.cluster.model import Host
from corral.defaults import DEFAULT_MASTER_PORT
from corral.redact import redact_env

Launcher = Literal["torchrun", "python", "accelerate", "mlx", "command", "madengine"]
LAUNCHERS: tuple[str, ...] = ("torchrun", "python", "accelerate", "mlx", "command", "madengine")
ServiceLauncher = Literal["torchrun", "python", "accelerate", "mlx", "command"]
"""The launchers a served job can use (see docs/launchers.md); ``command`` runs
``command_template`` on every machine instead of a script."""
NODE_LAUNCHERS: tuple[str, ...] = ("command", "madengine")
"""Launchers whose one process per node is the whole command (no SCRIPT): it starts
the ranks itself, like torchrun."""
MLX_BACKENDS: tuple[str, ...] = ("ring", "mpi", "jaccl")
LR_SCALING: tuple[str, ...] = ("linear", "sqrt", "none")
HarnessMode = Literal["plugin", "script"]

DEFAULT_RDZV_TIMEOUT = 300.0


@dataclass(frozen=True)
class LauncherOptions:
    """The options of one launcher (``JobSpec.launcher_options``): each launcher that
    has some defines its subclass in its own module of :mod:`corral.plan.launchers`."""

    LAUNCHER: ClassVar[str] = ""
    """The launcher these options belong to."""
    FLAGS: ClassVar[Mapping[str, str]] = {}
    """Each field's command-line option (errors name it)."""
    LEGACY: ClassVar[Mapping[str, str]] = {}
    """Each field's name as a flat field of a job (``corral run``'s options, the API's
    request, a spec written before launcher options were typed)."""


@dataclass(frozen=True)
class JobSpec:
    """A job as the user describes it, independent of any cluster."""

    script: str
    args: tuple[str, ...] = ()
    launcher: Launcher = "torchrun"
    job_id: str = "corral-job"
    python: str | None = None
    nproc_per_node: int | None = None
    master_addr: str | None = None
    master_port: int = DEFAULT_MASTER_PORT
    workdir: str | None = None
    env: Mapping[str, str] = field(default_factory=dict)
    nccl_interface: str | None = None
    gloo_interface: str | None = None
    timeout: float | None = None
    max_restarts: int = 0
    checkpoint_dir: str | None = None
    replicate_checkpoints: bool = False
    """Rank 0's saves wait for the coordinator's replica (``CORRAL_CHECKPOINT_REPLICA=wait``)."""
    rdzv_timeout: float = DEFAULT_RDZV_TIMEOUT
    run_dir: str = "runs"
    secret_env: tuple[str, ...] = ()
    """Keys of ``env`` whose values are secret besides the ones named like secrets
    (``--secret-env``); see :mod:`corral.redact`."""
    shared_data_path: str | None = None
    """A path every host must see as the same filesystem (``--shared-data-path``)."""
    workload_weights: tuple[float, ...] = ()
    """One weight per global rank, in rank order (``--calibration``): exported as
    ``CORRAL_WORKLOAD_WEIGHTS``; empty = a uniform split."""
    qos: str | None = None
    """macOS QoS class every rank applies at start (``--qos``), ``CORRAL_QOS``."""
    collective_timeout: float | None = None
    """Seconds the ranks' process group may wait to form and in any one collective
    (``--collective-timeout``), exported as ``CORRAL_DIST_TIMEOUT`` (the SDK applies
    it); None: the SDK's own default."""
    launcher_options: LauncherOptions | None = None
    """The launcher's own options (``--mlx-backend``, ``--command-template``, madengine's
    ``--tags``): an instance of its type in :mod:`corral.plan.launchers`; None = its
    defaults."""
    harness: HarnessMode | None = None
    """Run ``script`` through the plugin harness (``--harness``): ``plugin`` (a
    plugin directory's ``main.py``, imported as ``main``) or ``script``."""
    harness_config: str | None = None
    """The plugin's JSON config (its ``--config_file``) as read on this machine; each
    attempt's plan adjusts it to that attempt's world size."""
    lr_scaling: str = "linear"
    """How the harness scales the config's learning rate with the world size."""
    launch_dir: str | None = None
    """The directory the job was launched from, fixed once when the spec is resolved
    (:func:`corral.job.resolve.resolve`), so every attempt's plan is the same: the SSH
    hosts' working directory without ``--workdir`` and local nodes'
    ``CORRAL_LAUNCH_DIR``. None (a spec planned unresolved): the SSH hosts' home
    directory, and no ``CORRAL_LAUNCH_DIR``."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "args", tuple(self.args))
        object.__setattr__(self, "workload_weights", tuple(self.workload_weights))
        object.__setattr__(self, "env", MappingProxyType(dict(self.env)))
        object.__setattr__(self, "secret_env", tuple(self.secret_env))


@dataclass(frozen=True)
class RankProcess:
    """One process the node agent starts itself (``python`` launcher: one per rank)."""

    rank: int
    local_rank: int
    env: Mapping[str, str]

    def __post_init__(self) -> None:
        object.__setattr__(self, "env", MappingProxyType(dict(self.env)))


@dataclass(frozen=True)
class NodeCommand:
    """What one node runs: ``argv`` in ``cwd`` with exactly ``env``.

    With ``ranks`` empty, the agent starts ``argv`` once and it spawns the rank
    processes itself (torchrun); otherwise the agent starts ``argv`` once per
    entry of ``ranks`` with that entry's env added (``python`` launcher).
    ``expected_ranks`` is how many rank processes the node will run.
    """

    host: Host
    node_rank: int
    argv: tuple[str, ...]
    env: Mapping[str, str]
    cwd: str
    nproc: int
    ranks: tuple[RankProcess, ...] = ()
    master_addr: str = ""
    master_port: int = 0
    hosts_master: bool = False
    secret_env: tuple[str, ...] = ()  # extra secret keys (JobSpec.secret_env)
    reference_argv: tuple[str, ...] = ()
    """The launcher's own command these processes stand for (``accelerate launch
    ...``): shown by ``corral plan`` for reference, never run."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "secret_env", tuple(self.secret_env))
        object.__setattr__(self, "reference_argv", tuple(self.reference_argv))
        object.__setattr__(self, "argv", tuple(self.argv))
        object.__setattr__(self, "env", MappingProxyType(dict(self.env)))
        object.__setattr__(self, "ranks", tuple(self.ranks))

    def to_json(self, *, redact: bool = False) -> dict[str, Any]:
        """A JSON-able description: the agent's spec (``redact=False``: the real env
        the ranks need), or what is printed and stored (``redact=True``: secret
        values replaced, see :mod:`corral.redact`)."""

        def env(values: Mapping[str, str]) -> dict[str, str]:
            return redact_env(values, self.secret_env) if redact else dict(values)

        doc: dict[str, Any] = {
            "host": self.host.name,
            "address": self.host.address,
            "node_rank": self.node_rank,
            "argv": list(self.argv),
            "env": env(self.env),
            "cwd": self.cwd,
            "nproc": self.nproc,
            "ranks": [
                {"rank": r.rank, "local_rank": r.local_rank, "env": env(r.env)} for r in self.ranks
            ],
            "master_addr": self.master_addr,
            "master_port": self.master_port,
            "hosts_master": self.hosts_master,
            "secret_env": list(self.secret_env),
        }
        if self.reference_argv:
            doc["reference_argv"] = list(self.reference_argv)
        return doc
