"""Adjust a training configuration to the job's world size."""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from corral.contract import JOB_CONFIG_ENV, ScaleBy, ScaleRule, adjust_config, scale
from corral.sdk._env import info

__all__ = [
    "JOB_CONFIG_ENV",
    "ScaleRule",
    "adjust_config",
    "job_config",
    "output_dir",
    "scale_config",
]


def scale_config(
    config: Mapping[str, Any] | None = None,
    *,
    batch_size: int,
    lr: float,
    rule: ScaleRule = "linear",
    base_batch_size: int | None = None,
    scale_by: ScaleBy = "global_batch",
    world_size: int | None = None,
) -> dict[str, Any]:
    """Return a copy of ``config`` adjusted for data-parallel training.

    ``batch_size`` is the global batch: each rank gets ``batch_size // world_size``
    (a ``ValueError`` if that is 0; a ``RuntimeWarning`` if it does not divide, and
    the global batch actually used is then ``per_device * world_size``).
    ``world_size`` defaults to the job's.

    The learning rate follows the linear scaling rule of Goyal et al. 2017,
    "Accurate, Large Minibatch SGD: Training ImageNet in 1 Hour"
    (arXiv:1706.02677): when the global batch is k times the batch the
    learning rate was tuned for, multiply the learning rate by k. So with
    ``scale_by="global_batch"`` (the default), ``lr`` is the rate tuned for a
    global batch of ``base_batch_size`` (default: ``batch_size``, i.e. ``lr`` is
    already right for this global batch) and the factor is
    ``k = global batch / base_batch_size``: ``k`` (``rule="linear"``),
    ``sqrt(k)`` (``"sqrt"``, the square-root rule often used with adaptive
    optimizers) or 1 (``"none"``). The world size only splits the global batch
    across ranks: after an elastic restart on fewer nodes the same global batch
    keeps the same learning rate, each rank taking a larger share.

    ``scale_by="world_size"`` is the adjustment of the system corral grew from
    (TransformerLab's distributed trainer: divide the batch by the world size,
    multiply the learning rate by it): the factor is ``world_size``,
    ``sqrt(world_size)`` or 1. That is the rule above when ``lr`` was tuned for
    one process at the per-device batch, so ``base_batch_size`` is implied
    (``batch_size // world_size``) and giving it is a ``ValueError``; the
    learning rate then changes whenever the world size does.

    Keys set: ``batch_size`` (per device), ``lr`` (scaled), ``global_batch_size``,
    ``base_batch_size``, ``base_lr``, ``lr_scale``, ``lr_scale_rule``,
    ``lr_scale_by``, ``world_size``, ``rank``, ``local_rank``,
    ``is_main_process``. ``config`` itself is never mutated.
    """
    me = info()
    out = dict(config or {})
    out.update(
        scale(
            batch_size=batch_size,
            lr=lr,
            world_size=me.world_size if world_size is None else world_size,
            rule=rule,
            base_batch_size=base_batch_size,
            scale_by=scale_by,
            stacklevel=2,
        ),
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


def job_config() -> dict[str, Any] | None:
    """The config a job was submitted with through ``corral serve`` (None without one).

    The server adjusts it once for the whole job when asked (``adjust_config``:
    batch size / world size, learning rate scaled, distributed metadata under
    ``distributed``); this adds what differs per rank: ``rank``, ``local_rank``,
    ``world_size``, ``is_main_process`` and, when the config has an output
    directory, the rank-0-only rule: other ranks get ``<output_dir>/rank-N`` (a
    scratch place of their own, so they never overwrite rank 0's outputs).
    """
    raw = os.environ.get(JOB_CONFIG_ENV)
    if not raw:
        return None
    import json

    config = json.loads(raw)
    if not isinstance(config, dict):
        raise ValueError(f"{JOB_CONFIG_ENV} is not a JSON object")
    me = info()
    config.update(
        rank=me.rank,
        local_rank=me.local_rank,
        world_size=me.world_size,
        is_main_process=me.rank == 0,
    )
    meta = config.get("distributed")
    key = meta.get("output_dir_key", "output_dir") if isinstance(meta, dict) else "output_dir"
    if me.rank != 0 and isinstance(config.get(key), str) and isinstance(meta, dict):
        config[key] = os.path.join(config[key], f"rank-{me.rank}")
    return config
