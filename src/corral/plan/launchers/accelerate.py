"""The ``accelerate`` launcher: corral starts every rank itself (as ``python``),
with Accelerate's env prepared by the worker; the ``accelerate launch`` line the
ranks stand for is shown by ``corral plan``, never run."""

from __future__ import annotations

from corral.contract import ACCELERATE_ENV
from corral.plan.launchers.base import (
    Launcher,
    NodeContext,
    NodeFacts,
    NodePlan,
    rank_processes,
    set_rank_layout,
    worker_argv,
)
from corral.plan.spec import JobSpec


def accelerate_reference(spec: JobSpec, facts: NodeFacts) -> tuple[str, ...]:
    """The ``accelerate launch`` line a node's ranks stand for (shown, never run).

    Accelerate 1.x has no ``--multi_node`` flag (the seed's line has one):
    ``--num_machines`` makes it multi-node and ``--multi_gpu`` picks torchrun's
    launcher; on a CPU host corral's ranks get ``ACCELERATE_USE_CPU=1`` instead
    (``accelerate launch --cpu`` would start one process, not a distributed group).
    """
    return (
        "accelerate",
        "launch",
        "--multi_gpu",
        "--num_machines",
        str(facts.nnodes),
        "--machine_rank",
        str(facts.node_rank),
        "--main_process_ip",
        facts.master_addr,
        "--main_process_port",
        str(facts.master_port),
        "--num_processes",
        str(facts.world_size),
        "--max_restarts",
        "0",
        spec.script,
        *spec.args,
    )


def _plan_node(ctx: NodeContext) -> NodePlan:
    # ACCELERATE_ENV (``1``): the worker prepares Accelerate's env (ACCELERATE_USE_CPU
    # on a host without a GPU) and refuses a world size other than the plan's
    set_rank_layout(ctx)
    ctx.env[ACCELERATE_ENV] = "1"
    return NodePlan(
        worker_argv(ctx),
        ranks=rank_processes(ctx.rank_base, ctx.facts.nproc_per_node),
        reference=accelerate_reference(ctx.spec, ctx.facts),
    )


LAUNCHER = Launcher("accelerate", _plan_node, runs_harness=True)
