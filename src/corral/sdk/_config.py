"""Adjust a training configuration to the job's world size."""

from __future__ import annotations

import math
import os
import warnings
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

from corral.sdk._env import info

__all__ = ["output_dir", "scale_config"]

ScaleRule = Literal["linear", "sqrt", "none"]


def scale_config(
    config: Mapping[str, Any] | None = None,
    *,
    batch_size: int,
    lr: float,
    rule: ScaleRule = "linear",
    world_size: int | None = None,
) -> dict[str, Any]:
    """Return a copy of ``config`` adjusted for data-parallel training.

    ``batch_size`` is the global batch: each rank gets ``batch_size // world_size``
    (a ``ValueError`` if that is 0; a ``RuntimeWarning`` if it does not divide).
    ``lr`` is multiplied by ``world_size`` (``"linear"``), ``sqrt(world_size)``
    (``"sqrt"``) or left as is (``"none"``). ``world_size`` defaults to the job's.

    Keys set: ``batch_size`` (per device), ``lr`` (scaled), ``global_batch_size``,
    ``base_lr``, ``lr_scale``, ``lr_scale_rule``, ``world_size``, ``rank``,
    ``local_rank``, ``is_main_process``. ``config`` itself is never mutated.
    """
    me = info()
    world = me.world_size if world_size is None else world_size
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise ValueError(f"batch_size must be a positive integer, got {batch_size!r}")
    if not isinstance(world, int) or world < 1:
        raise ValueError(f"world_size must be a positive integer, got {world!r}")
    if not math.isfinite(lr) or lr <= 0:
        raise ValueError(f"lr must be a positive number, got {lr!r}")
    if batch_size < world:
        raise ValueError(
            f"global batch_size {batch_size} is smaller than world_size {world}: "
            "every rank needs at least one example per step"
        )
    if rule == "linear":
        factor = float(world)
    elif rule == "sqrt":
        factor = math.sqrt(world)
    elif rule == "none":
        factor = 1.0
    else:
        raise ValueError(f"unknown lr scaling rule {rule!r} (use 'linear', 'sqrt' or 'none')")
    per_device = batch_size // world
    if per_device * world != batch_size:
        warnings.warn(
            f"batch_size {batch_size} is not divisible by world_size {world}; "
            f"using {per_device} per device (global {per_device * world})",
            RuntimeWarning,
            stacklevel=2,
        )
    out = dict(config or {})
    out.update(
        batch_size=per_device,
        lr=lr * factor,
        global_batch_size=per_device * world,
        base_lr=lr,
        lr_scale=factor,
        lr_scale_rule=rule,
        world_size=world,
        rank=me.rank,
        local_rank=me.local_rank,
        is_main_process=me.rank == 0,
    )
    return out


def output_dir(path: str | os.PathLike[str]) -> Path | None:
    """Create ``path`` on global rank 0 and return it; return None on every other rank.

    Returning None (rather than a path) makes accidental writes from other
    ranks fail loudly instead of racing on shared outputs.
    """
    if info().rank != 0:
        return None
    out = Path(path)
    out.mkdir(parents=True, exist_ok=True)
    return out
