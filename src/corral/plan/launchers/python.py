"""The ``python`` launcher: the node agent starts every rank itself, one
``python -m corral.agent.worker SCRIPT`` per rank, with torchrun's variables."""

from __future__ import annotations

from corral.plan.launchers.base import (
    Launcher,
    NodeContext,
    NodePlan,
    rank_processes,
    set_rank_layout,
    worker_argv,
)


def _plan_node(ctx: NodeContext) -> NodePlan:
    set_rank_layout(ctx)
    return NodePlan(worker_argv(ctx), ranks=rank_processes(ctx.rank_base, ctx.facts.nproc_per_node))


LAUNCHER = Launcher("python", _plan_node, runs_harness=True)
