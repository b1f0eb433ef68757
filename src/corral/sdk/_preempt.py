""" "Checkpoint now": a request the training loop polls.

Before a Slurm job's time limit corral's batch script sends every rank
``SIGUSR2`` (see ``corral slurm render --signal-lead``), then requeues the job;
``kill -USR2 PID`` asks a rank by hand. :func:`checkpoint_requested` installs the
handler on its first call (call it once early) and answers, at each step, whether a
request came since it last answered ``True``::

    for step in range(start, total):
        ...
        if sdk.checkpoint_requested():      # every rank gets the same answer
            sdk.save_checkpoint({"step": step + 1, ...}, ckpt_dir, step + 1)

With a process group up, the ranks agree (an all-reduce of one flag), so a collective
checkpoint is taken by every rank at the same step.
"""

from __future__ import annotations

import signal
import sys
import threading
from types import FrameType

__all__ = ["CHECKPOINT_SIGNAL", "checkpoint_requested", "request_checkpoint"]

CHECKPOINT_SIGNAL = signal.SIGUSR2
"""The signal that asks for a checkpoint (``SIGUSR1`` is corral's stack dump)."""

_requested = threading.Event()
_installed = False


def _on_signal(signum: int, frame: FrameType | None) -> None:
    _requested.set()


def _install() -> None:
    global _installed
    if _installed or threading.current_thread() is not threading.main_thread():
        return  # signal handlers live in the main thread; polls elsewhere still answer
    signal.signal(CHECKPOINT_SIGNAL, _on_signal)
    _installed = True


def request_checkpoint() -> None:
    """Ask for a checkpoint from inside the process (as the signal does)."""
    _requested.set()


def _agree(flag: bool) -> bool:
    """``flag`` OR-ed over the ranks when a process group of several is up."""
    if "torch" not in sys.modules:
        return flag
    import torch
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() < 2:
        return flag
    device = "cpu"
    if dist.get_backend() == "nccl":
        device = f"cuda:{torch.cuda.current_device()}"
    value = torch.tensor([1 if flag else 0], dtype=torch.int32, device=device)
    dist.all_reduce(value, op=dist.ReduceOp.MAX)
    return bool(value.item())


def checkpoint_requested(*, sync: bool = True) -> bool:
    """Whether a checkpoint was asked for since the last ``True`` (installs the
    ``SIGUSR2`` handler on the first call). ``sync``: every rank of the process group
    calls it at the same step and gets the same answer (one small all-reduce)."""
    _install()
    flag = _requested.is_set()
    if sync:
        flag = _agree(flag)
    if flag:
        _requested.clear()
    return flag
