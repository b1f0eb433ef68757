"""Resume a job from its latest checkpoint, on every rank, each from its own disk.

After a restart corral makes sure the newest complete checkpoint is on every
host of the job (copying it to the hosts that lack it when the checkpoint
directory is host-local), so each rank loads the file from its own host: no
checkpoint is ever pickled through a collective, whatever its size. The ranks
exchange only which checkpoint they see (one small ``all_gather_object``) and
all load the same one. At most one checkpoint interval of work is lost.

A relative directory is the job's: on ``local:N`` it resolves against
``$CORRAL_LAUNCH_DIR`` (where corral was started, or ``--workdir``), not the
node's per-job dir the ranks run in, so a rerun of the job finds it.
"""

from __future__ import annotations

import os
import socket
import sys
from pathlib import Path
from typing import Any

from corral.contract import CHECKPOINT_DIR_ENV, HOST_ENV
from corral.sdk._checkpoint import checkpoint_files, is_complete_checkpoint, load_checkpoint
from corral.sdk._env import info
from corral.sdk._paths import job_path

__all__ = ["resume"]


def _group() -> Any:
    """``torch.distributed`` when a process group of more than one rank is up, else None
    (without importing torch in a script that never did: none can be up there)."""
    if "torch.distributed" not in sys.modules:
        return None
    try:
        import torch.distributed as dist
    except ImportError:
        return None
    if not dist.is_available() or not dist.is_initialized() or dist.get_world_size() < 2:
        return None
    return dist


def _directory(directory: str | os.PathLike[str] | None) -> Path:
    if directory is not None:
        return job_path(directory)
    env = os.environ.get(CHECKPOINT_DIR_ENV, "").strip()
    if not env:
        raise ValueError(
            f"resume() needs a checkpoint directory: pass one, or run under corral with "
            f"--checkpoint-dir (which sets {CHECKPOINT_DIR_ENV})"
        )
    return job_path(env)


def _newest(folder: Path) -> tuple[int, Path] | None:
    """The newest complete rank-0 checkpoint in ``folder``: (step, path), or None."""
    for step, path in reversed(checkpoint_files(folder)):
        if is_complete_checkpoint(path):
            return step, path
    return None


def _host() -> str:
    return os.environ.get(HOST_ENV, "").strip() or socket.gethostname()


def _announce(path: Path, state: dict[str, Any]) -> None:
    if "step" in state:
        print(f"[corral] resuming from {path} (step {state['step']})", flush=True)


def _missing(facts: list[tuple[int | None, str, str]], step: int) -> str:
    """The message every rank raises when some rank's host lacks checkpoint ``step``."""
    name = f"ckpt-{step:08d}.pt"
    lacking = [
        f"rank {rank} on host {host} has no complete {os.path.join(folder, name)}"
        for rank, (seen, host, folder) in enumerate(facts)
        if seen != step
    ]
    holders = sorted({host for seen, host, _ in facts if seen == step})
    return (
        f"cannot resume from step {step} ({name}, found on {', '.join(holders)}): "
        + "; ".join(lacking)
        + " (corral places the newest checkpoint on every host when it restarts a job;"
        " without corral, copy it there or use a shared --checkpoint-dir)"
    )


def resume(
    directory: str | os.PathLike[str] | None = None,
    *,
    map_location: Any = "cpu",
    weights_only: bool = True,
) -> dict[str, Any] | None:
    """The state of the latest complete checkpoint in ``directory``, or None when there is none.

    ``directory`` defaults to ``$CORRAL_CHECKPOINT_DIR`` (``--checkpoint-dir``);
    ValueError when neither is given. The newest complete rank-0 checkpoint is
    loaded with ``map_location`` and rank 0 prints ``[corral] resuming from PATH
    (step N)`` when the state has a ``"step"``. When a ``torch.distributed``
    process group of more than one rank is initialized (call this after
    ``init_distributed``), the ranks first agree on the checkpoint: the highest
    step any rank finds complete in its own ``directory``; every rank then loads
    that file from its own host's disk (corral puts it on every host when it
    restarts a job). This is a collective, so every rank must call it; when some
    rank's host lacks the chosen file, every rank raises FileNotFoundError naming
    those ranks, hosts and paths (rather than silently starting from an older
    step or from scratch). Without a process group each process loads from its
    own ``directory``.
    """
    folder = _directory(directory)
    dist = _group()
    mine = _newest(folder)
    if dist is None:
        if mine is None:
            return None
        state = load_checkpoint(mine[1], map_location, weights_only=weights_only)
        if info().rank == 0:
            _announce(mine[1], state)
        return state
    fact = (None if mine is None else mine[0], _host(), os.path.abspath(folder))
    facts: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(facts, fact)
    steps = [seen for seen, _, _ in facts if seen is not None]
    if not steps:
        return None
    step = max(steps)
    if any(seen != step for seen, _, _ in facts):
        raise FileNotFoundError(_missing(facts, step))
    assert mine is not None
    state = load_checkpoint(mine[1], map_location, weights_only=weights_only)
    if dist.get_rank() == 0:
        _announce(mine[1], state)
    return state
