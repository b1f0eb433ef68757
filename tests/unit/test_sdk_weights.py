"""corral.sdk workload weights: parsing, per-rank batch sizes, the loss factor and its gradient."""

from __future__ import annotations

import itertools
import math
import random

import pytest

from corral import sdk
from corral.sdk._weights import WEIGHTS_ENV, apportion, batch_sizes, parse_weights
from tests.conftest import require_torch

pytestmark = pytest.mark.usefixtures("clean_dist_env")


@pytest.fixture(autouse=True)
def _no_weights(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(WEIGHTS_ENV, raising=False)


def ranks(monkeypatch: pytest.MonkeyPatch, world: int, rank: int, weights: str | None) -> None:
    monkeypatch.setenv("WORLD_SIZE", str(world))
    monkeypatch.setenv("RANK", str(rank))
    if weights is not None:
        monkeypatch.setenv(WEIGHTS_ENV, weights)


def test_the_exported_weights_are_read_and_normalised(monkeypatch: pytest.MonkeyPatch) -> None:
    ranks(monkeypatch, 2, 1, "0.333333,0.666667")
    weights = sdk.workload_weights()
    assert weights is not None
    assert math.isclose(weights[0], 1 / 3, rel_tol=1e-5)
    assert math.isclose(sum(weights), 1.0)
    assert parse_weights("1, 3") == (0.25, 0.75)


def test_no_weights_means_none_and_a_uniform_factor(monkeypatch: pytest.MonkeyPatch) -> None:
    ranks(monkeypatch, 4, 3, None)
    assert sdk.workload_weights() is None
    monkeypatch.setenv(WEIGHTS_ENV, "  ")
    assert sdk.workload_weights() is None
    assert sdk.loss_scale() == 1.0
    assert sdk.local_batch_size(256) == 64
    assert sdk.loss_scale(256) == 1.0


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        ("0.5,abc", r"entry 1 \('abc'\) is not a positive number"),
        ("0.5,0", r"entry 1 \('0'\) is not a positive number"),
        ("-1,2", r"entry 0 \('-1'\) is not a positive number"),
        ("0.5,nan", r"entry 1 \('nan'\) is not a positive number"),
        ("1,2,3", r"has 3 weights for a world size of 2: one per global rank"),
        ("0.5,", r"entry 1 \(''\) is not a positive number"),
    ],
)
def test_bad_weights_name_the_variable(
    monkeypatch: pytest.MonkeyPatch, raw: str, message: str
) -> None:
    ranks(monkeypatch, 2, 0, raw)
    with pytest.raises(ValueError, match=message) as caught:
        sdk.workload_weights()
    assert WEIGHTS_ENV in str(caught.value)


def test_local_batch_sizes_follow_the_weights_by_largest_remainder(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    ranks(monkeypatch, 2, 0, "0.333333,0.666667")
    assert batch_sizes(256) == (85, 171)  # 85.33 / 170.67: the larger remainder gets the 1
    assert sdk.local_batch_size(256) == 85
    monkeypatch.setenv("RANK", "1")
    assert sdk.local_batch_size(256) == 171
    assert math.isclose(sdk.loss_scale(256), 2 * 171 / 256)
    assert math.isclose(sdk.loss_scale(), 2 * 0.666667, rel_tol=1e-5)
    assert batch_sizes(7, [1, 1, 1], world_size=3) == (3, 2, 2)  # a tie goes to the lower rank


def test_every_rank_gets_at_least_one_example(monkeypatch: pytest.MonkeyPatch) -> None:
    assert batch_sizes(4, [0.001, 0.999], world_size=2) == (1, 3)
    assert batch_sizes(3, [0.001, 0.001, 0.998], world_size=3) == (1, 1, 1)
    with pytest.raises(ValueError, match="global batch 2 is smaller than the world size 3"):
        batch_sizes(2, [1, 1, 1], world_size=3)
    with pytest.raises(ValueError, match=r"3 workload weights \[1, 1, 1\] for a world size of 2"):
        batch_sizes(8, [1, 1, 1], world_size=2)
    with pytest.raises(ValueError, match="one positive number per rank"):
        batch_sizes(8, [1, -1], world_size=2)


def test_batch_sizes_sum_exactly_and_stay_within_one_of_the_quota() -> None:
    rng = random.Random(13)
    for _ in range(2000):
        world = rng.randint(1, 12)
        weights = [rng.choice([rng.uniform(0.01, 1.0), rng.randint(1, 4)]) for _ in range(world)]
        total = rng.randint(world, 5000)
        sizes = batch_sizes(total, weights, world_size=world)
        assert sum(sizes) == total
        assert min(sizes) >= 1
        quotas = [total * w / sum(weights) for w in weights]
        if all(q >= 1 for q in quotas):  # no part was raised to the minimum
            assert all(abs(s - q) < 1 for s, q in zip(sizes, quotas, strict=True)), (
                weights,
                total,
            )
        assert sizes == batch_sizes(total, list(weights), world_size=world)  # deterministic


def test_apportion_without_a_minimum_can_give_zero() -> None:
    assert apportion(2, [3, 5, 8], minimum=0) == (0, 1, 1)
    assert sum(apportion(10**9 + 7, [0.1, 0.2, 0.7])) == 10**9 + 7


def test_weighted_batches_times_the_loss_scale_give_the_uniform_global_gradient() -> None:
    """What DDP computes (the mean over ranks of each rank's gradient) with rank i's mean
    loss multiplied by loss_scale equals the gradient of the whole global batch's mean loss."""
    torch = require_torch()
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.Tanh(), torch.nn.Linear(8, 3))
    x, y = torch.randn(100, 6), torch.randint(0, 3, (100,))
    loss_fn = torch.nn.CrossEntropyLoss()

    def grads(loss: object) -> list[object]:
        return list(torch.autograd.grad(loss, list(model.parameters())))

    def ddp_average(sizes: tuple[int, ...], scales: list[float]) -> list[object]:
        """The mean over ranks of each rank's gradient, rank i holding the next sizes[i] rows."""
        bounds = [0, *itertools.accumulate(sizes)]
        out = [torch.zeros_like(p) for p in model.parameters()]
        for rank, scale in enumerate(scales):
            part = slice(bounds[rank], bounds[rank + 1])
            for total, g in zip(out, grads(loss_fn(model(x[part]), y[part]) * scale), strict=True):
                total += g / len(scales)
        return out

    reference = grads(loss_fn(model(x), y))
    for weights in ([0.2, 0.3, 0.5], [1, 1, 1], [0.9, 0.05, 0.05], [5, 1, 2]):
        world = len(weights)
        sizes = batch_sizes(100, weights, world_size=world)
        scales = [sdk.loss_scale(100, weights, rank=r, world_size=world) for r in range(world)]
        for got, want in zip(ddp_average(sizes, scales), reference, strict=True):
            assert torch.allclose(got, want, atol=1e-6, rtol=1e-5), weights
        # without the factor the average is a different (wrong) gradient
        plain = ddp_average(sizes, [1.0] * world)
        assert not all(
            torch.allclose(a, b, atol=1e-6) for a, b in zip(plain, reference, strict=True)
        )
