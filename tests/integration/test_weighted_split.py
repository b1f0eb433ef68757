"""The weighted split under real DDP (gloo on CPU, 2 ranks): the same update as the uniform
global batch, and examples/train_ddp.py with CORRAL_WORKLOAD_WEIGHTS under corral."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import require_torch

from .conftest import REPO, free_port, run_corral, spawn_ranks

pytestmark = pytest.mark.torch

EXAMPLE = REPO / "examples" / "train_ddp.py"


@pytest.fixture(scope="module")
def ranks(tmp_path_factory: pytest.TempPathFactory) -> list[dict[str, Any]]:
    from tests.integration._weighted_ranks import rank_main  # torch only where a test runs

    tmp = tmp_path_factory.mktemp("weighted")
    spawn_ranks(rank_main, (str(tmp), free_port()), 2)
    return [json.loads((tmp / f"{r}.json").read_text()) for r in range(2)]


@pytest.fixture(scope="module")
def reference() -> list[Any]:
    """The parameters after training on each step's whole global batch in one process."""
    from tests.integration._weighted_ranks import uniform_reference

    return uniform_reference()


def test_weighted_ddp_equals_the_uniform_global_batch(
    ranks: list[dict[str, Any]], reference: list[Any]
) -> None:
    torch = require_torch()
    for result in ranks:
        got = [torch.tensor(p) for p in result["scaled"]["params"]]
        for a, b in zip(got, reference, strict=True):
            assert torch.allclose(a, b, atol=1e-5, rtol=1e-4), (a - b).abs().max()


def test_without_the_loss_scale_the_update_differs(
    ranks: list[dict[str, Any]], reference: list[Any]
) -> None:
    torch = require_torch()
    got = [torch.tensor(p) for p in ranks[0]["plain"]["params"]]
    assert max(float((a - b).abs().max()) for a, b in zip(got, reference, strict=True)) > 1e-3


def test_both_ranks_ran_the_same_steps_with_proportional_batches(
    ranks: list[dict[str, Any]],
) -> None:
    from tests.integration._weighted_ranks import EPOCHS

    # per epoch: 3 full steps of (16, 48), then the last 8 examples split (2, 6)
    assert ranks[0]["scaled"]["sizes"] == [16, 16, 16, 2] * EPOCHS
    assert ranks[1]["scaled"]["sizes"] == [48, 48, 48, 6] * EPOCHS


def test_the_example_uses_the_weights_under_corral(run_dir: Path, tmp_path: Path) -> None:
    """Under corral the ranks get the weights, train with them and report what they processed
    (the python launcher: test_weighted_run_local covers the weights under torchrun, and a
    torchrun per node imports torch once more)."""
    proc = run_corral(
        "run", "--hosts", "local:2", "--launcher", "python", "--master-port", "0",
        "--run-dir", str(run_dir),
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
