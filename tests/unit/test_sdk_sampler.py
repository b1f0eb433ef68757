"""corral.sdk.WeightedDistributedSampler: coverage, equal steps, determinism, DataLoader use."""

from __future__ import annotations

import random
from collections import Counter

import pytest

from corral import sdk
from corral.sdk._weights import WEIGHTS_ENV, batch_sizes
from tests.conftest import require_torch

pytestmark = [pytest.mark.torch, pytest.mark.usefixtures("clean_dist_env")]


@pytest.fixture(autouse=True)
def _no_weights(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(WEIGHTS_ENV, raising=False)


def samplers(
    n: int, weights: list[float], global_batch: int | None, **kw: object
) -> list[sdk.WeightedDistributedSampler]:
    """One sampler per rank, as every rank of the job would build it."""
    return [
        sdk.WeightedDistributedSampler(
            range(n),
            num_replicas=len(weights),
            rank=r,
            weights=weights,
            global_batch=global_batch,
            **kw,  # type: ignore[arg-type]
        )
        for r in range(len(weights))
    ]


def cases() -> list[tuple[int, list[float], int | None]]:
    rng = random.Random(2024)
    out: list[tuple[int, list[float], int | None]] = [
        (4096, [1 / 3, 2 / 3], 256),
        (1000, [0.25, 0.75], 64),
        (10, [1, 1, 1], 4),  # tail of 2 < 3 ranks: folded into the previous step
        (7, [1, 2, 4], 7),
        (5, [1, 1, 1, 1, 1], 5),
        (17, [0.9, 0.1], None),
    ]
    for _ in range(150):
        world = rng.randint(1, 9)
        weights = [rng.uniform(0.05, 1.0) for _ in range(world)]
        global_batch = rng.choice([None, rng.randint(world, 4 * world + 40)])
        low = world if global_batch is None else max(world, global_batch)
        out.append((rng.randint(low, 700), weights, global_batch))
    return out


@pytest.mark.parametrize("shuffle", [True, False])
def test_every_index_exactly_once_per_epoch_with_equal_steps(shuffle: bool) -> None:
    for n, weights, global_batch in cases():
        ranks = samplers(n, weights, global_batch, shuffle=shuffle, seed=7)
        for epoch in (0, 3):
            for s in ranks:
                s.set_epoch(epoch)
            seen = Counter(i for s in ranks for i in s)
            assert seen == Counter(range(n)), (n, weights, global_batch)
            assert [len(s) for s in ranks] == list(ranks[0].shares)
            assert sum(ranks[0].shares) == n
            if global_batch is None:
                continue
            steps = {len(list(s.batches())) for s in ranks}
            assert steps == {ranks[0].num_steps}, (n, weights, global_batch)
            full = batch_sizes(global_batch, weights, world_size=len(weights))
            for s in ranks:
                sizes = [len(b) for b in s.batches()]
                assert sizes == [s.step_sizes(k)[s.rank] for k in range(len(sizes))]
                assert min(sizes) >= 1
                # every step but the last is the proportional per-rank batch
                assert all(size == full[s.rank] for size in sizes[:-1])
                assert [i for b in s.batches() for i in b] == list(s)


def test_shares_follow_the_weights() -> None:
    ranks = samplers(4096, [1 / 3, 2 / 3], 256, seed=1)
    assert [s.batch_size for s in ranks] == [85, 171]
    assert ranks[0].num_steps == 16  # 4096 = 16 * 256: no partial step
    assert ranks[0].shares == (16 * 85, 16 * 171)
    assert [s.loss_scale(0) for s in ranks] == [2 * 85 / 256, 2 * 171 / 256]


def test_layout_of_a_short_tail_and_of_drop_last() -> None:
    # 1000 = 15 * 64 + 40: 15 full steps of (16, 48), a last one of 40 split (10, 30)
    ranks = samplers(1000, [0.25, 0.75], 64)
    assert [s.batch_size for s in ranks] == [16, 48]
    assert ranks[0].num_steps == 16
    assert ranks[0].step_sizes(15) == (10, 30)
    assert ranks[0].shares == (15 * 16 + 10, 15 * 48 + 30)
    assert ranks[1].loss_scale(0) == 2 * 48 / 64
    assert ranks[1].loss_scale(15) == 2 * 30 / 40
    # 10 examples, batch 4 over 3 ranks: 2 left over (< 3 ranks) join the second step
    short = samplers(10, [1, 1, 1], 4)
    assert short[0].num_steps == 2
    assert short[0].step_sizes(0) == (2, 1, 1)
    assert short[0].step_sizes(1) == (3, 2, 1)
    dropped = samplers(1000, [0.25, 0.75], 64, drop_last=True)
    assert dropped[0].num_steps == 15
    assert sum(dropped[0].shares) == 960
    assert len({i for s in dropped for i in s}) == 960


def test_the_same_seed_gives_the_same_partition_and_epochs_differ() -> None:
    a = samplers(500, [0.2, 0.3, 0.5], 50, seed=11)
    b = samplers(500, [0.2, 0.3, 0.5], 50, seed=11)
    assert [list(s) for s in a] == [list(s) for s in b]
    first = list(a[0])
    a[0].set_epoch(1)
    assert list(a[0]) != first
    other = samplers(500, [0.2, 0.3, 0.5], 50, seed=12)
    assert list(other[0]) != first
    ordered = samplers(12, [1, 2], 6, shuffle=False)
    assert [list(s) for s in ordered] == [[0, 1, 6, 7], [2, 3, 4, 5, 8, 9, 10, 11]]


def test_weights_and_topology_come_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv(WEIGHTS_ENV, "0.25,0.75")
    sampler = sdk.WeightedDistributedSampler(range(1000), global_batch=64)
    assert (sampler.rank, sampler.num_replicas, sampler.batch_size) == (1, 2, 48)
    assert sampler.weights == (0.25, 0.75)
    assert len(sampler) == 15 * 48 + 30
    assert "rank 1/2" in repr(sampler)
    monkeypatch.delenv(WEIGHTS_ENV)
    uniform = sdk.WeightedDistributedSampler(range(10))
    assert uniform.shares == (5, 5)


def test_a_dataloader_runs_the_same_steps_on_every_rank() -> None:
    torch = require_torch()
    from torch.utils.data import DataLoader, TensorDataset

    data = TensorDataset(torch.arange(103))
    loaders = [
        DataLoader(data, batch_sampler=s.batch_sampler())
        for s in samplers(103, [0.5, 0.3, 0.2], 20, seed=3)
    ]
    assert [len(loader) for loader in loaders] == [6, 6, 6]
    batches = [[b[0] for b in loader] for loader in loaders]
    assert [len(b) for b in batches] == [6, 6, 6]
    everything = torch.cat([t for rank in batches for t in rank])
    assert sorted(everything.tolist()) == list(range(103))
    # with batch_size + sampler the batches are the same when no tail was folded
    s = samplers(103, [0.5, 0.3, 0.2], 20, seed=3)[1]
    plain = DataLoader(data, batch_size=s.batch_size, sampler=s)
    assert [b[0].tolist() for b in plain] == [b.tolist() for b in batches[1]]


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"n": 2, "weights": [1, 1, 1]}, "a dataset of 2 examples cannot give each of 3 ranks one"),
        ({"n": 9, "weights": [1, 1], "drop_last": True}, "drop_last needs global_batch"),
        (
            {"n": 9, "weights": [1, 1], "drop_last": True, "global_batch": 10},
            "leaves no step",
        ),
        ({"n": 9, "weights": [1, 1], "global_batch": 1}, "smaller than the world size 2"),
        ({"n": 9, "weights": [1, 0], "global_batch": 4}, "one positive number per rank"),
    ],
)
def test_bad_arguments_say_what_is_wrong(kwargs: dict[str, object], message: str) -> None:
    n = kwargs.pop("n")
    with pytest.raises(ValueError, match=message):
        sdk.WeightedDistributedSampler(
            range(n), num_replicas=len(kwargs["weights"]), rank=0, **kwargs
        )  # type: ignore[arg-type]


def test_steps_need_a_global_batch() -> None:
    sampler = samplers(10, [1, 1], None)[0]
    assert sampler.num_steps is None and sampler.batch_size is None
    with pytest.raises(ValueError, match="global_batch"):
        sampler.batch_sampler()
    with pytest.raises(ValueError, match="invalid rank 2 for num_replicas 2"):
        sdk.WeightedDistributedSampler(range(10), num_replicas=2, rank=2)
