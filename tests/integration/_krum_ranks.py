"""What each rank of tests/integration/test_krum.py runs (torch; imported by the test lazily).

``spawn_ranks`` (``torch.multiprocessing``) pickles ``rank_main`` by name, so it
lives at module level here, out of the test module: importing the test module (every
xdist worker collects it) does not import torch.
No ``from __future__ import annotations``: DDP checks the hook's annotations as objects.
"""

import gc
import hashlib
import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook
from torch.nn.parallel import DistributedDataParallel

from corral import sdk

DIM = 8


def teacher() -> torch.Tensor:
    return torch.randn(DIM, 1, generator=torch.Generator().manual_seed(99))


def batch(step: int, rank: int) -> tuple[torch.Tensor, torch.Tensor]:
    x = torch.randn(32, DIM, generator=torch.Generator().manual_seed(1000 * step + rank))
    return x, x @ teacher()


def eval_loss(model: nn.Module) -> float:
    x = torch.randn(512, DIM, generator=torch.Generator().manual_seed(7))
    with torch.no_grad():
        return float(nn.functional.mse_loss(model(x), x @ teacher()))


Hook = Callable[[Any, dist.GradBucket], torch.futures.Future[torch.Tensor]]


def corrupted(inner: Hook) -> Hook:
    """The Byzantine rank's hook: its gradients sign-flipped and scaled by 100."""

    def hook(state: Any, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
        bucket.buffer().mul_(-100.0)
        return inner(state, bucket)

    return hook


def train(rank: int, mode: str, bad: int, steps: int) -> dict[str, Any]:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(DIM, 16), nn.Tanh(), nn.Linear(16, 1))
    ddp = DistributedDataParallel(model)
    inner: Any = (
        allreduce_hook if mode == "mean" else sdk.krum_hook(f=1, m=3 if mode == "multi" else None)
    )
    ddp.register_comm_hook(None, corrupted(inner) if rank == bad else inner)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    initial = eval_loss(model)
    for step in range(steps):
        x, y = batch(step, rank)
        optimizer.zero_grad()
        nn.functional.mse_loss(ddp(x), y).backward()
        optimizer.step()
    digest = hashlib.sha256(b"".join(p.detach().numpy().tobytes() for p in model.parameters()))
    out = {
        "initial": initial,
        "final": eval_loss(model),
        "params": digest.hexdigest(),
        "selected": getattr(inner, "selected", None),
    }
    del ddp, model, optimizer  # free the DDP wrapper before the group goes
    gc.collect()
    return out


def rank_main(rank: int, tmp: str, port: int, world: int, bad: int, steps: int) -> None:
    """One rank: ``f=2`` refused on ``world`` ranks, then mean, Krum and multi-Krum training."""
    torch.set_num_threads(1)
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(world), MASTER_ADDR="127.0.0.1")
    os.environ["MASTER_PORT"] = str(port)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    result: dict[str, Any] = {}
    try:
        sdk.krum_hook(f=2)
    except ValueError as exc:
        result["f2"] = str(exc)
    for mode in ("mean", "krum", "multi"):
        result[mode] = train(rank, mode, bad, steps)
    dist.destroy_process_group()
    Path(tmp, f"{rank}.json").write_text(json.dumps(result))
