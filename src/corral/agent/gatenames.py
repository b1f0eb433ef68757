"""The names and command lines the gate (:mod:`corral.agent.gate`) is started with,
apart from it: the agent, the entry point and a torchrun's workers started ahead
(:mod:`corral.agent.aheadworkers`) use them without importing the gate itself."""

from __future__ import annotations

from corral.contract import CONTRACT_VARS

TORCHRUN = "torch.distributed.run"
WORKER = "corral.agent.worker"
#: The modules that can be held at the gate (what the torchrun and per-rank plans run).
GATED_MODULES = (TORCHRUN, WORKER)
GATE_MODULE = "corral.agent.gate"
WARM_FLAG = "--warm"
#: Variables a process held at its gate reads only after it (torch reads them when a
#: process group or rendezvous is made; corral's worker and SDK when they run): with
#: corral's own ``CORRAL_*`` they may differ from those it was started with.
LATE_ENV = frozenset(
    {v for v in CONTRACT_VARS if not v.startswith("CORRAL_")}
    | {"GROUP_RANK", "NCCL_SOCKET_IFNAME", "GLOO_SOCKET_IFNAME"}
)


_FLAGS = frozenset({"-u", "-B", "-s", "-E", "-I", "-q"})  # interpreter flags allowed before -m


def split_argv(argv: list[str] | tuple[str, ...]) -> tuple[list[str], list[str]] | None:
    """``[PYTHON, *flags, "-m", MODULE, *args]`` of a gateable module as (everything up
    to the module, the module's arguments); None for any other command."""
    argv = list(argv)
    for at in range(1, len(argv) - 1):
        if argv[at] == "-m":
            if argv[at + 1] not in GATED_MODULES:
                return None
            return argv[: at + 2], argv[at + 2 :]
        if argv[at] not in _FLAGS:
            return None
    return None


def gated_argv(argv: list[str], fd: int, ready: int | None = None) -> list[str]:
    """``argv`` (see :func:`split_argv`) run through the gate on ``fd``, telling
    ``ready`` (when given) that its imports are done."""
    split = split_argv(argv)
    if split is None:
        raise ValueError(f"not a command the gate can hold: {argv[:4]}")
    head, args = split
    fds = str(fd) if ready is None else f"{fd},{ready}"
    return [*head[:-2], "-m", GATE_MODULE, fds, head[-1], *args]
