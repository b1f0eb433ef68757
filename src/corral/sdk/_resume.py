"""Resume a job from its latest checkpoint, on every rank.

After a restart corral makes sure the newest complete checkpoint is on the
host that runs global rank 0 (copying it there when the checkpoint directory is
host-local), so :func:`resume` reads it on rank 0 only and, in a distributed
job, hands the file's bytes to the other ranks with one broadcast: no other host
needs a copy on its disk. At most one checkpoint interval of work is lost.
"""

from __future__ import annotations

import io
import os
from pathlib import Path
from typing import Any

from corral.sdk._checkpoint import latest_checkpoint, load_checkpoint, load_state
from corral.sdk._env import info

__all__ = ["resume"]

CHECKPOINT_DIR_ENV = "CORRAL_CHECKPOINT_DIR"


def _group() -> Any:
    """``torch.distributed`` when a process group of more than one rank is up, else None."""
    try:
        import torch.distributed as dist
    except ImportError:
        return None
    if not dist.is_available() or not dist.is_initialized() or dist.get_world_size() < 2:
        return None
    return dist


def _directory(directory: str | os.PathLike[str] | None) -> Path:
    if directory is not None:
        return Path(directory)
    env = os.environ.get(CHECKPOINT_DIR_ENV, "").strip()
    if not env:
        raise ValueError(
            f"resume() needs a checkpoint directory: pass one, or run under corral with "
            f"--checkpoint-dir (which sets {CHECKPOINT_DIR_ENV})"
        )
    return Path(env)


def _announce(path: Path, state: dict[str, Any]) -> None:
    if "step" in state:
        print(f"[corral] resuming from {path} (step {state['step']})", flush=True)


def resume(
    directory: str | os.PathLike[str] | None = None,
    *,
    map_location: Any = "cpu",
    weights_only: bool = True,
) -> dict[str, Any] | None:
    """The state of the latest complete checkpoint in ``directory``, or None when there is none.

    ``directory`` defaults to ``$CORRAL_CHECKPOINT_DIR`` (``--checkpoint-dir``);
    ValueError when neither is given. Rank 0 finds the newest complete rank-0
    checkpoint with :func:`latest_checkpoint` and prints ``[corral] resuming from
    PATH (step N)`` when the state has a ``"step"``. When a ``torch.distributed``
    process group of more than one rank is initialized (call this after
    ``init_distributed``), rank 0 broadcasts the file's bytes and every rank
    loads them with ``map_location``, so other hosts need no copy; this is a
    collective, so every rank must call it. Without a process group each
    process loads from its own ``directory``.
    """
    folder = _directory(directory)
    dist = _group()
    if dist is None:
        path = latest_checkpoint(folder)
        if path is None:
            return None
        state = load_checkpoint(path, map_location, weights_only=weights_only)
        if info().rank == 0:
            _announce(path, state)
        return state
    box: list[Any] = [None]
    if dist.get_rank() == 0:
        try:
            path = latest_checkpoint(folder)
            box[0] = None if path is None else ("ok", str(path), path.read_bytes())
        except OSError as exc:
            box[0] = ("error", f"rank 0 could not read its checkpoint: {exc}", b"")
    dist.broadcast_object_list(box, src=0)
    message = box[0]
    if message is None:
        return None
    kind, where, data = message
    if kind != "ok":
        raise OSError(where)
    state = load_state(io.BytesIO(data), where, map_location, weights_only=weights_only)
    if dist.get_rank() == 0:
        _announce(Path(where), state)
    return state
