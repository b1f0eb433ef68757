"""The names the gate (:mod:`corral.agent.gate`) is started with, apart from it: the
agent and the entry point name them before anything of the gate's is imported."""

from __future__ import annotations

TORCHRUN = "torch.distributed.run"
WORKER = "corral.agent.worker"
#: The modules that can be held at the gate (what the torchrun and per-rank plans run).
GATED_MODULES = (TORCHRUN, WORKER)
GATE_MODULE = "corral.agent.gate"
WARM_FLAG = "--warm"
