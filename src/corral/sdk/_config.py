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
ScaleBy = Literal["global_batch", "world_size"]

_RULES: tuple[str, ...] = ("linear", "sqrt", "none")
_SCALE_BY: tuple[str, ...] = ("global_batch", "world_size")


def _positive_int(name: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be a positive integer, got {value!r}")
    return value


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
    world = me.world_size if world_size is None else world_size
    batch_size = _positive_int("batch_size", batch_size)
    world = _positive_int("world_size", world)
    if isinstance(lr, bool) or not isinstance(lr, int | float) or not math.isfinite(lr) or lr <= 0:
        raise ValueError(f"lr must be a positive number, got {lr!r}")
    if rule not in _RULES:
        raise ValueError(f"unknown lr scaling rule {rule!r} (use 'linear', 'sqrt' or 'none')")
    if scale_by not in _SCALE_BY:
        raise ValueError(f"unknown scale_by {scale_by!r} (use 'global_batch' or 'world_size')")
    if base_batch_size is not None:
        base_batch_size = _positive_int("base_batch_size", base_batch_size)
        if scale_by == "world_size":
            raise ValueError(
                "base_batch_size applies to scale_by='global_batch'; with "
                "scale_by='world_size' the lr is taken as tuned at the per-device batch"
            )
    if batch_size < world:
        raise ValueError(
            f"global batch_size {batch_size} is smaller than world_size {world}: "
            "every rank needs at least one example per step"
        )
    per_device = batch_size // world
    if per_device * world != batch_size:
        warnings.warn(
            f"batch_size {batch_size} is not divisible by world_size {world}; "
            f"using {per_device} per device (global {per_device * world})",
            RuntimeWarning,
            stacklevel=2,
        )
    global_batch = per_device * world
    if scale_by == "world_size":
        reference = per_device
    else:
        reference = batch_size if base_batch_size is None else base_batch_size
    ratio = global_batch / reference
    if rule == "linear":
        factor = ratio
    elif rule == "sqrt":
        factor = math.sqrt(ratio)
    else:
        factor = 1.0
    out = dict(config or {})
    out.update(
        batch_size=per_device,
        lr=lr * factor,
        global_batch_size=global_batch,
        base_batch_size=reference,
        base_lr=lr,
        lr_scale=factor,
        lr_scale_rule=rule,
        lr_scale_by=scale_by,
        world_size=world,
        rank=me.rank,
        local_rank=me.local_rank,
        is_main_process=me.rank == 0,
    )
    return out


def adjust_config(
    config: Mapping[str, Any],
    world_size: int,
    *,
    rule: ScaleRule = "linear",
    batch_size_key: str = "batch_size",
    lr_key: str = "learning_rate",
    output_dir_key: str = "output_dir",
    require: bool = True,
) -> dict[str, Any]:
    """A whole job's config adjusted once for ``world_size`` (the seed's adjustments,
    used by ``corral serve`` and the plugin harness): the batch divided by the world
    size, the learning rate scaled by it (:func:`scale_config` with
    ``scale_by="world_size"``), and the distributed metadata under ``distributed``
    (which :func:`job_config` reads on each rank for the rank-0-only output rule).

    With ``require`` a missing batch size or learning rate is a ``ValueError`` (as
    is a bad value); without it, what is missing is left alone.
    """
    out = dict(config)
    batch, lr = out.get(batch_size_key), out.get(lr_key)
    if require and (batch is None or lr is None):
        raise ValueError(f"needs config[{batch_size_key!r}] and config[{lr_key!r}]")
    meta: dict[str, Any] = {"world_size": world_size}
    if batch is not None:
        scaled = scale_config(
            {}, batch_size=batch, lr=1.0, rule=rule, scale_by="world_size", world_size=world_size
        )
        out[batch_size_key] = scaled["batch_size"]
        meta["global_batch_size"] = scaled["global_batch_size"]
    if lr is not None:
        # with no batch size, a global batch of one example per rank: the factor is
        # the world size's (linear), its square root or 1, as with one
        scaled = scale_config(
            {},
            batch_size=batch if batch is not None else world_size,
            lr=lr,
            rule=rule,
            scale_by="world_size",
            world_size=world_size,
        )
        out[lr_key] = scaled["lr"]
        meta.update(
            base_lr=scaled["base_lr"],
            lr_scale=scaled["lr_scale"],
            lr_scale_rule=scaled["lr_scale_rule"],
        )
    meta.update(output_dir_key=output_dir_key, rank0_only_output=output_dir_key in out)
    out["distributed"] = meta
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


JOB_CONFIG_ENV = "CORRAL_JOB_CONFIG"


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
