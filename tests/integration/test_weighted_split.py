"""The weighted split under real DDP (gloo on CPU, 2 ranks): the same update as the uniform
global batch, and examples/train_ddp.py with CORRAL_WORKLOAD_WEIGHTS under corral."""

from __future__ import annotations

import gc
import json
import os
import re
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import require_torch

require_torch()
pytestmark = pytest.mark.torch

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.multiprocessing as mp  # noqa: E402
from torch import nn  # noqa: E402
from torch.nn.parallel import DistributedDataParallel  # noqa: E402
from torch.utils.data import DataLoader, TensorDataset  # noqa: E402

from corral import sdk  # noqa: E402
from tests.integration.conftest import run_corral  # noqa: E402
from tests.integration.test_sdk_torchrun import EXAMPLE, free_port  # noqa: E402

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


def _rank_main(rank: int, tmp: str, port: int) -> None:
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


@pytest.fixture(scope="module")
def ranks(tmp_path_factory: pytest.TempPathFactory) -> list[dict[str, Any]]:
    tmp = tmp_path_factory.mktemp("weighted")
    mp.spawn(_rank_main, args=(str(tmp), free_port()), nprocs=2, join=True)
    return [json.loads((tmp / f"{r}.json").read_text()) for r in range(2)]


def test_weighted_ddp_equals_the_uniform_global_batch(ranks: list[dict[str, Any]]) -> None:
    reference = uniform_reference()
    for result in ranks:
        got = [torch.tensor(p) for p in result["scaled"]["params"]]
        for a, b in zip(got, reference, strict=True):
            assert torch.allclose(a, b, atol=1e-5, rtol=1e-4), (a - b).abs().max()


def test_without_the_loss_scale_the_update_differs(ranks: list[dict[str, Any]]) -> None:
    reference = uniform_reference()
    got = [torch.tensor(p) for p in ranks[0]["plain"]["params"]]
    assert max(float((a - b).abs().max()) for a, b in zip(got, reference, strict=True)) > 1e-3


def test_both_ranks_ran_the_same_steps_with_proportional_batches(
    ranks: list[dict[str, Any]],
) -> None:
    # per epoch: 3 full steps of (16, 48), then the last 8 examples split (2, 6)
    assert ranks[0]["scaled"]["sizes"] == [16, 16, 16, 2] * EPOCHS
    assert ranks[1]["scaled"]["sizes"] == [48, 48, 48, 6] * EPOCHS


def test_the_example_uses_the_weights_under_corral(run_dir: Path, tmp_path: Path) -> None:
    """Under corral the ranks get the weights, train with them and report what they processed."""
    proc = run_corral(
        "run", "--hosts", "local:2", "--master-port", "0", "--run-dir", str(run_dir),
        "--job-id", "weighted", "--env", "CORRAL_WORKLOAD_WEIGHTS=0.25,0.75",
        "--", str(EXAMPLE), "--steps", "40",
        cwd=tmp_path,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    for line in (
        "rank 0: weighted split, weight 0.2500, batch 64 of 256, 16 steps per epoch, loss x0.5000",
        "rank 1: weighted split, weight 0.7500, batch 192 of 256, 16 steps per epoch, loss x1.5000",
    ):
        assert line in proc.stdout, proc.stdout
    losses = re.search(r"final loss ([\d.]+) \(initial ([\d.]+)\)", proc.stdout)
    assert losses, proc.stdout
    assert float(losses[1]) < float(losses[2]) / 2, losses[0]
    # the progress reports reached the supervisor with each rank's examples per step
    for rank, examples in ((0, 64), (1, 192)):
        pattern = rf"step 40/40 loss=\S+ examples={examples} busy=\S+ \(rank {rank}\)"
        assert re.search(pattern, proc.stderr), proc.stderr[-2000:]
