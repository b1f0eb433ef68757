"""The quorum-following split of sdk.fault_tolerant (pure functions, no torch)."""

from __future__ import annotations

import random
from collections import Counter
from fractions import Fraction

import pytest

from corral.contract import WORKLOAD_WEIGHTS_ENV
from corral.sdk._ftsplit import group_weights, quorum_share, stream_indices


def _shares(step: int, batch: int, live: dict[int, float], ranks: int = 1) -> dict:
    return {
        (g, r): quorum_share(step, batch, live, g, r, (1.0,) * ranks)
        for g in live
        for r in range(ranks)
    }


def test_live_groups_cover_the_step_exactly() -> None:
    for live in ({0: 1.0, 1: 1.0, 2: 1.0}, {0: 1.0, 2: 1.0}, {1: 1.0}):
        shares = _shares(7, 96, live, ranks=2)
        positions = [p for s in shares.values() for p in range(s.start, s.start + s.count)]
        assert sorted(positions) == list(range(7 * 96, 8 * 96))
        assert all(s.participants == len(live) and s.participating for s in shares.values())


def test_departed_group_share_is_resplit_by_weight() -> None:
    weights = {0: 1.0, 1: 3.0, 2: 2.0}
    full = _shares(0, 60, weights)
    assert [full[(g, 0)].count for g in range(3)] == [10, 30, 20]
    survivors = _shares(0, 60, {0: 1.0, 2: 2.0})  # group 1 lost: 60 split 1:2
    assert [survivors[(g, 0)].count for g in (0, 2)] == [20, 40]


def test_loss_scale_gives_the_global_batch_gradient() -> None:
    """(1/n) sum_g (1/L) sum_l scale * mean(grad over the rank's examples) == mean over B."""
    rng = random.Random(1)
    grads = [Fraction(rng.randint(-100, 100)) for _ in range(97)]
    for live, local in (({0: 0.2, 1: 0.5, 2: 0.3}, (1.0, 2.0)), ({0: 1.0, 2: 4.0}, (1.0, 1.0))):
        total = Fraction(0)
        for g in live:
            for r in range(len(local)):
                s = quorum_share(0, 97, live, g, r, local)
                mean = sum(grads[s.start : s.start + s.count]) / s.count
                total += Fraction(s.loss_scale).limit_denominator(10**9) * mean
        averaged = total / len(live) / len(local)
        assert abs(averaged - sum(grads) / 97) < Fraction(1, 10**6)


def test_non_participant_gets_a_zero_weight_stand_in() -> None:
    s = quorum_share(5, 32, {0: 1.0, 1: 1.0}, 2)
    assert not s.participating and s.loss_scale == 0.0 and s.count == 1
    assert s.participants == 2 and s.start == 5 * 32


def test_every_example_once_per_epoch_across_quorum_changes_and_redone_steps() -> None:
    """Steps commit or fail (then they are redone whole by the next quorum); groups leave
    and come back: each example of each epoch is still read exactly once."""
    size, batch = 50, 12
    rng = random.Random(3)
    read: list[int] = []
    step = 0
    while len(read) < 3 * size:
        live = {g: 1.0 + g for g in range(3) if rng.random() < 0.7} or {0: 1.0}
        taken = []
        for g in live:
            s = quorum_share(step, batch, live, g)
            taken += stream_indices(s.start, s.count, size, seed=9)
        if rng.random() < 0.3:
            continue  # not committed: the same step again
        read += taken
        step += 1
    for epoch in range(3):
        assert Counter(read[epoch * size : (epoch + 1) * size]) == Counter(range(size))


def test_stream_crosses_epochs_deterministically() -> None:
    first = stream_indices(0, 10, 10, seed=4)
    assert sorted(first) == list(range(10)) and first != list(range(10))
    assert stream_indices(8, 4, 10, seed=4) == first[8:] + stream_indices(10, 2, 10, seed=4)
    assert stream_indices(8, 4, 10, shuffle=False) == [8, 9, 0, 1]


def test_group_weights_per_rank_or_per_group() -> None:
    per_group, per_rank = group_weights("1,1,2,2,3,3", 3, 2)
    assert per_group == (2.0, 4.0, 6.0) and per_rank[1] == (2.0, 2.0)
    per_group, per_rank = group_weights("1,3", 2, 2)
    assert per_group == (1.0, 3.0) and per_rank[1] == (1.5, 1.5)


@pytest.mark.parametrize(
    ("raw", "match"),
    [
        ("1,2,3,4,5", "5 weights for 3 replica groups of 2 ranks"),
        ("1,0,1", r"entry 1 \('0'\) is not a positive number"),
    ],
)
def test_group_weights_errors_name_the_source(raw: str, match: str) -> None:
    with pytest.raises(ValueError, match=WORKLOAD_WEIGHTS_ENV + "=.*" + match):
        group_weights(raw, 3, 2, source=WORKLOAD_WEIGHTS_ENV)


def test_batch_too_small_for_the_live_ranks() -> None:
    with pytest.raises(ValueError, match="global batch 3 is smaller than the 4 live ranks"):
        quorum_share(0, 3, {0: 1.0, 1: 1.0}, 0, 0, (1.0, 1.0))
