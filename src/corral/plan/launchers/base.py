"""What every launcher module is: a :class:`Launcher` record (its name, its own
options type, how it plans one node) and the facts a node's plan is made from.

:func:`corral.plan.render.plan_job` computes what every node shares (the env corral
sets for every launcher, the node's facts) and hands each node's
:class:`NodeContext` to the launcher's ``plan_node``, which returns the node's
command (:class:`NodePlan`) and adds its own variables to ``ctx.env``. Pure.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

from corral.cluster.model import Host
from corral.errors import ConfigError
from corral.plan.spec import JobSpec, LauncherOptions, RankProcess

WORKER_MODULE = "corral.agent.worker"
"""The module every rank corral starts runs first (``python -m corral.agent.worker
SCRIPT``): it reports to the node agent, then runs the script."""

_Options = TypeVar("_Options", bound=LauncherOptions)


@dataclass(frozen=True)
class NodeFacts:
    """What a node's command may name: one field per placeholder of a template."""

    node_rank: int
    nnodes: int
    nproc_per_node: int
    world_size: int
    master_addr: str
    master_port: int
    host: str
    job_id: str
    nccl_interface: str = ""
    gloo_interface: str = ""


@dataclass(frozen=True)
class NodeContext:
    """One node of a plan, as a launcher plans it: ``env`` is the node's env so far
    (the launcher adds its own variables to it)."""

    spec: JobSpec
    host: Host
    facts: NodeFacts
    env: dict[str, str]
    python: str
    """The interpreter on the host."""
    attempt: int
    rank_base: int
    """The global rank of the node's first rank."""
    master_node: int
    """The index of the node that hosts the rendezvous."""
    peers: tuple[tuple[str, int], ...]
    """``(address, nproc)`` of every node, in node-rank order."""


@dataclass(frozen=True)
class NodePlan:
    """What a launcher plans for one node: ``argv`` (started once, or once per entry
    of ``ranks``) and, for reference, the launcher's own command it stands for."""

    argv: tuple[str, ...]
    ranks: tuple[RankProcess, ...] = ()
    reference: tuple[str, ...] = ()


def _no_check(spec: JobSpec) -> None:
    """A launcher with nothing of its own to check."""


@dataclass(frozen=True)
class Launcher:
    """One launcher, as the registry (:mod:`corral.plan.launchers`) holds it."""

    name: str
    plan_node: Callable[[NodeContext], NodePlan]
    options: type[LauncherOptions] | None = None
    """Its own options type (``JobSpec.launcher_options``), None when it has none."""
    validate: Callable[[JobSpec], None] = _no_check
    """Checks of its options that need no cluster (ConfigError naming the option)."""
    runs_own_command: bool = False
    """One process per node that is the whole command (no SCRIPT): it starts the
    ranks itself, like torchrun."""
    probes_master: bool = True
    """Its ranks serve the rendezvous at the master port (MLX's ring uses the ports
    after it: nothing there to probe)."""
    runs_harness: bool = False
    """The plugin harness (``--harness``) may run under it."""


def options_of(spec: JobSpec, kind: type[_Options]) -> _Options:
    """``spec``'s options for its launcher, or that launcher's defaults."""
    options = spec.launcher_options
    return options if isinstance(options, kind) else kind()


def worker_argv(ctx: NodeContext) -> tuple[str, ...]:
    """A rank's command when corral starts every rank itself: the worker, then SCRIPT."""
    return (ctx.python, "-u", "-m", WORKER_MODULE, ctx.spec.script, *ctx.spec.args)


def rank_processes(rank_base: int, nproc: int) -> tuple[RankProcess, ...]:
    """The node's ranks when corral starts each one (``RANK`` and ``LOCAL_RANK`` set)."""
    return tuple(
        RankProcess(
            rank=rank_base + local,
            local_rank=local,
            env={"RANK": str(rank_base + local), "LOCAL_RANK": str(local)},
        )
        for local in range(nproc)
    )


def set_rank_layout(ctx: NodeContext) -> None:
    """The variables torchrun would set per node, for launchers whose ranks corral
    starts itself: ``WORLD_SIZE``, ``LOCAL_WORLD_SIZE``, ``NODE_RANK``."""
    ctx.env["WORLD_SIZE"] = str(ctx.facts.world_size)
    ctx.env["LOCAL_WORLD_SIZE"] = str(ctx.facts.nproc_per_node)
    ctx.env["NODE_RANK"] = str(ctx.facts.node_rank)


def foreign_options(options: LauncherOptions) -> ConfigError:
    """The error for options of another launcher than the job's (naming the first
    option that was given)."""
    given = [flag for name, flag in options.FLAGS.items() if getattr(options, name) is not None]
    flag = given[0] if given else next(iter(options.FLAGS.values()), "--launcher")
    return ConfigError(f"applies to --launcher {options.LAUNCHER} only", option=flag)
