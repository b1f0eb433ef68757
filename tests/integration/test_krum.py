"""sdk.krum_hook: Byzantine-robust DDP on 5 CPU ranks (gloo), one rank sending corrupted gradients.

One spawn trains the same regression three times: DDP's default mean (the
corrupted rank wins: the model diverges), Krum and multi-Krum (the corrupted
rank is never picked: the model converges).
"""

import json
import math
from typing import Any

import pytest

from corral.sdk._krum import check_krum, krum_aggregate, krum_select
from tests.conftest import require_torch

from .conftest import free_port, spawn_ranks

pytestmark = pytest.mark.torch

WORLD = 5
BAD = 3  # the Byzantine rank
STEPS = 60


@pytest.fixture(scope="module")
def results(tmp_path_factory: pytest.TempPathFactory) -> list[dict[str, Any]]:
    from tests.integration._krum_ranks import rank_main  # torch only where a test runs

    tmp = tmp_path_factory.mktemp("krum")
    spawn_ranks(rank_main, (str(tmp), free_port(), WORLD, BAD, STEPS), WORLD)
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
    torch = require_torch()
    honest = torch.tensor([[1.0, 1.0], [1.1, 0.9], [0.9, 1.1], [1.0, 1.05], [1.02, 0.98]])
    vectors = torch.cat([honest, torch.tensor([[-100.0, -100.0]])])
    assert 5 not in krum_select(vectors, f=1, m=4)
    assert krum_select(vectors, f=1)[0] in range(5)
    assert torch.allclose(krum_aggregate(vectors, f=1, m=5), honest.mean(dim=0))


def test_non_finite_vectors_score_worst() -> None:
    torch = require_torch()
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
