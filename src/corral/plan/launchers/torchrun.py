"""The ``torchrun`` launcher (the default): one ``torch.distributed.run`` per node
with c10d rendezvous at the master and explicit timeouts; it starts the node's
ranks, each through corral's worker."""

from __future__ import annotations

from corral.contract import PLAN_NODE_ENV, PLAN_NPROCS_ENV, STREAMS_ENV
from corral.plan.launchers.base import WORKER_MODULE, Launcher, NodeContext, NodePlan


def rdzv_id(job_id: str, attempt: int) -> str:
    """torchrun's rendezvous id: one per attempt, so a straggler of an earlier attempt
    can never join a later one."""
    return job_id if attempt == 0 else f"{job_id}-a{attempt}"


def _fmt_seconds(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else str(value)


def _plan_node(ctx: NodeContext) -> NodePlan:
    spec, facts = ctx.spec, ctx.facts
    rdzv_conf = (
        f"join_timeout={_fmt_seconds(spec.rdzv_timeout)},read_timeout=60,"
        f"is_host={1 if facts.node_rank == ctx.master_node else 0}"
    )
    argv = (
        ctx.python,
        "-m",
        "torch.distributed.run",
        f"--nnodes={facts.nnodes}",
        f"--nproc-per-node={facts.nproc_per_node}",
        "--rdzv-backend=c10d",
        f"--rdzv-endpoint={facts.master_addr}:{facts.master_port}",
        f"--rdzv-id={rdzv_id(spec.job_id, ctx.attempt)}",
        f"--rdzv-conf={rdzv_conf}",
        "--max-restarts=0",
        "--monitor-interval=0.1",
        f"--local-addr={ctx.host.address}",
        "-m",
        WORKER_MODULE,
        spec.script,
        *spec.args,
    )
    ctx.env[STREAMS_ENV] = "socket"
    if spec.workload_weights:  # ranks are numbered at the rendezvous, not here:
        # the SDK finds its own weight by plan node and exchanges them
        ctx.env[PLAN_NODE_ENV] = str(facts.node_rank)
        ctx.env[PLAN_NPROCS_ENV] = ",".join(str(n) for _, n in ctx.peers)
    return NodePlan(argv)


LAUNCHER = Launcher("torchrun", _plan_node, runs_harness=True)
