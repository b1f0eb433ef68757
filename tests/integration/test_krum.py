"""sdk.krum_hook: Byzantine-robust DDP on 5 CPU ranks (gloo), one rank sending corrupted gradients.

One spawn trains the same regression three times: DDP's default mean (the
corrupted rank wins: the model diverges), Krum and multi-Krum (the corrupted
rank is never picked: the model converges).
"""

import gc
import hashlib
import json
import math
import os
import socket
from collections.abc import Callable
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
from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook  # noqa: E402
from torch.nn.parallel import DistributedDataParallel  # noqa: E402

from corral import sdk  # noqa: E402
from corral.sdk._krum import check_krum, krum_aggregate, krum_select  # noqa: E402

WORLD = 5
BAD = 3  # the Byzantine rank
STEPS = 60
DIM = 8


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


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


def train(rank: int, mode: str) -> dict[str, Any]:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(DIM, 16), nn.Tanh(), nn.Linear(16, 1))
    ddp = DistributedDataParallel(model)
    inner: Any = (
        allreduce_hook if mode == "mean" else sdk.krum_hook(f=1, m=3 if mode == "multi" else None)
    )
    ddp.register_comm_hook(None, corrupted(inner) if rank == BAD else inner)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    initial = eval_loss(model)
    for step in range(STEPS):
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


def _rank_main(rank: int, tmp: str, port: int) -> None:
    torch.set_num_threads(1)
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(WORLD), MASTER_ADDR="127.0.0.1")
    os.environ["MASTER_PORT"] = str(port)
    dist.init_process_group("gloo", rank=rank, world_size=WORLD)
    result: dict[str, Any] = {}
    try:
        sdk.krum_hook(f=2)
    except ValueError as exc:
        result["f2"] = str(exc)
    for mode in ("mean", "krum", "multi"):
        result[mode] = train(rank, mode)
    dist.destroy_process_group()
    Path(tmp, f"{rank}.json").write_text(json.dumps(result))


@pytest.fixture(scope="module")
def results(tmp_path_factory: pytest.TempPathFactory) -> list[dict[str, Any]]:
    tmp = tmp_path_factory.mktemp("krum")
    mp.spawn(_rank_main, args=(str(tmp), free_port()), nprocs=WORLD, join=True)
    return [json.loads((tmp / f"{r}.json").read_text()) for r in range(WORLD)]


def test_without_krum_one_corrupted_rank_makes_training_diverge(
    results: list[dict[str, Any]],
) -> None:
    mean = results[0]["mean"]
    assert not math.isfinite(mean["final"]) or mean["final"] > mean["initial"], mean


@pytest.mark.parametrize("mode", ["krum", "multi"])
def test_with_krum_the_model_converges_anyway(results: list[dict[str, Any]], mode: str) -> None:
    run = results[0][mode]
    assert run["final"] < 0.1 * run["initial"], run
    assert {r[mode]["params"] for r in results} == {run["params"]}  # replicas identical


@pytest.mark.parametrize(("mode", "picked"), [("krum", 1), ("multi", 3)])
def test_the_corrupted_rank_is_never_picked(
    results: list[dict[str, Any]], mode: str, picked: int
) -> None:
    for r in results:
        selected = r[mode]["selected"]
        assert selected[BAD] == 0, selected
        assert sum(selected) % (STEPS * picked) == 0 and sum(selected) > 0, selected


def test_too_few_ranks_for_f_is_refused_with_the_numbers(results: list[dict[str, Any]]) -> None:
    assert results[0]["f2"] == "Krum with f=2 needs at least 2f+3 = 7 ranks; the job has 5"


# -- the selection itself (no processes) ----------------------------------------------


def test_krum_picks_the_vector_among_the_honest_cluster() -> None:
    honest = torch.tensor([[1.0, 1.0], [1.1, 0.9], [0.9, 1.1], [1.0, 1.05], [1.02, 0.98]])
    vectors = torch.cat([honest, torch.tensor([[-100.0, -100.0]])])
    assert 5 not in krum_select(vectors, f=1, m=4)
    assert krum_select(vectors, f=1)[0] in range(5)
    assert torch.allclose(krum_aggregate(vectors, f=1, m=5), honest.mean(dim=0))


def test_non_finite_vectors_score_worst() -> None:
    vectors = torch.ones(7, 3)
    vectors[2, 1] = float("nan")
    vectors[4, 0] = float("inf")
    assert sorted(krum_select(vectors, f=2, m=5)) == [0, 1, 3, 5, 6]
    assert torch.equal(krum_aggregate(vectors, f=2, m=5), torch.ones(3))


@pytest.mark.parametrize(
    ("n", "f", "m", "message"),
    [
        (4, 1, None, r"needs at least 2f\+3 = 5 ranks; the job has 4"),
        (5, -1, None, "f .* must be an integer >= 0"),
        (5, 1, 5, "m .* must be between 1 and n-f = 4, got 5"),
        (5, 1, 0, "between 1 and n-f = 4, got 0"),
    ],
)
def test_bad_parameters_are_refused(n: int, f: int, m: int | None, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        check_krum(n, f, m)
