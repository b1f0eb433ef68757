"""The DDP side of tests/integration/test_weighted_split.py (torch; imported by the test lazily).

``spawn_ranks`` (``torch.multiprocessing``) pickles ``rank_main`` by name, so it
lives at module level here, out of the test module: importing the test module (every
xdist worker collects it) does not import torch.
"""

from __future__ import annotations

import gc
import json
import os
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, TensorDataset

from corral import sdk

N, GLOBAL_BATCH, WEIGHTS = 200, 64, (0.25, 0.75)  # 200 = 3 * 64 + 8: a short last step
EPOCHS, LR = 2, 0.5


def dataset() -> TensorDataset:
    gen = torch.Generator().manual_seed(5)
    return TensorDataset(torch.randn(N, 6, generator=gen), torch.randint(0, 3, (N,), generator=gen))


def model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(6, 16), nn.Tanh(), nn.Linear(16, 3))


def sampler(rank: int) -> sdk.WeightedDistributedSampler:
    return sdk.WeightedDistributedSampler(
        dataset(), num_replicas=2, rank=rank, weights=WEIGHTS, seed=3, global_batch=GLOBAL_BATCH
    )


def train_rank(rank: int, scaled: bool) -> dict[str, Any]:
    """``EPOCHS`` epochs of DDP on this rank's weighted share."""
    net = model()
    ddp = DistributedDataParallel(net)
    optimizer = torch.optim.SGD(net.parameters(), lr=LR)
    mine = sampler(rank)
    loader = DataLoader(dataset(), batch_sampler=mine.batch_sampler())
    sizes = []
    for epoch in range(EPOCHS):
        mine.set_epoch(epoch)
        for k, (x, y) in enumerate(loader):
            optimizer.zero_grad()
            loss = nn.functional.cross_entropy(ddp(x), y)
            (loss * (mine.loss_scale(k) if scaled else 1.0)).backward()
            optimizer.step()
            sizes.append(len(x))
    out = {"sizes": sizes, "params": [p.detach().flatten().tolist() for p in net.parameters()]}
    del ddp, net, optimizer  # free the DDP wrapper before the group goes
    gc.collect()
    return out


def rank_main(rank: int, tmp: str, port: int) -> None:
    torch.set_num_threads(1)
    os.environ.update(RANK=str(rank), WORLD_SIZE="2", MASTER_ADDR="127.0.0.1")
    os.environ["MASTER_PORT"] = str(port)
    dist.init_process_group("gloo", rank=rank, world_size=2)
    result = {"scaled": train_rank(rank, True), "plain": train_rank(rank, False)}
    dist.destroy_process_group()
    Path(tmp, f"{rank}.json").write_text(json.dumps(result))


def uniform_reference() -> list[torch.Tensor]:
    """One process, each step's whole global batch (both ranks' shares), its mean loss."""
    net = model()
    optimizer = torch.optim.SGD(net.parameters(), lr=LR)
    data = dataset()
    ranks = [sampler(0), sampler(1)]
    for epoch in range(EPOCHS):
        for s in ranks:
            s.set_epoch(epoch)
        for parts in zip(*(s.batches() for s in ranks), strict=True):
            x, y = data[[i for part in parts for i in part]]
            optimizer.zero_grad()
            nn.functional.cross_entropy(net(x), y).backward()
            optimizer.step()
    return [p.detach().flatten() for p in net.parameters()]
