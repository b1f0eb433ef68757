"""DDP and FSDP2 training backends on 2 CPU ranks with gloo (spawned processes, no actors runtime).

One spawn trains every variant for 30 steps and saves at step K into
per-rank directories (two "hosts" without shared storage); fresh processes
then resume from them; a single process reloads the global layout at world size 1.
"""

from __future__ import annotations

import json
from pathlib import Path
from statistics import mean
from typing import Any

import pytest

from corral.errors import ConfigError
from tests.conftest import require_torch

from .conftest import free_port

pytestmark = pytest.mark.torch


def spawn(phase: str, tmp: Path, world: int = 2) -> list[dict[str, Any]]:
    from tests.integration._backends_ranks import spawn as run  # torch: only when a test runs

    return run(phase, tmp, world, free_port())


@pytest.fixture(scope="module")
def ckpt_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("backends")


@pytest.fixture(scope="module")
def trained(ckpt_root: Path) -> list[dict[str, Any]]:
    return spawn("train", ckpt_root)


@pytest.fixture(scope="module")
def resumed(ckpt_root: Path, trained: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return spawn("resume", ckpt_root)


# -- the tests ---------------------------------------------------------------------------


def test_ddp_and_fsdp_follow_the_same_loss_trajectory(trained: list[dict[str, Any]]) -> None:
    from tests.integration._backends_ranks import CLIP, STEPS

    r0, r1 = trained
    ddp = r0["ddp"]
    assert mean(ddp["loss"][-5:]) < 0.1 * mean(ddp["loss"][:5]), ddp["loss"]  # it learns
    assert max(ddp["grad_norm"]) > CLIP > min(ddp["grad_norm"])  # clipping is exercised
    assert r1["ddp"]["loss"] == ddp["loss"]  # reported loss is the mean over ranks
    for variant in ("full", "grad_op", "no_shard"):
        got = r0[variant]
        assert got["loss"] == pytest.approx(ddp["loss"], rel=1e-4, abs=1e-6), variant
        assert got["grad_norm"] == pytest.approx(ddp["grad_norm"], rel=1e-4, abs=1e-6), variant
        assert got["lr"] == pytest.approx(ddp["lr"])
    assert ddp["lr"][0] < ddp["lr"][3] > ddp["lr"][-1]  # warmup, then cosine decay
    assert r0["state"]["sharding_strategy"] == "FULL_SHARD" and r0["state"]["step"] == STEPS
    assert r0["group_destroyed"] and r1["group_destroyed"]  # the backend that made it ends it
    assert (ckpt_root_of(r0) / "host0" / "full" / "step_00000012" / "rank_00000").is_dir()


def ckpt_root_of(result: dict[str, Any]) -> Path:
    return Path(result["state"]["checkpoint_dir"]).parents[1]


def test_host_local_dirs_hold_only_their_ranks_shards(trained: list[dict[str, Any]]) -> None:
    root = ckpt_root_of(trained[0])
    for rank in (0, 1):
        step_dir = root / f"host{rank}" / "full" / "step_00000012"
        assert [p.name for p in step_dir.iterdir()] == [f"rank_{rank:05d}"]
        meta = json.loads((step_dir / f"rank_{rank:05d}" / "meta.json").read_text())
        assert meta["world_size"] == 2 and meta["sharding_strategy"] == "FULL_SHARD"


def test_bf16_runs_or_falls_back_with_one_message(trained: list[dict[str, Any]]) -> None:
    from corral.actors import backends

    torch = require_torch()
    r0, r1 = trained
    native, _ = backends._bf16_support(torch.device("cpu"))  # a fixed property of build + CPU
    fallback = [m for m in r0["messages"] if "falls back to fp32" in m]
    for variant in ("fsdp_bf16", "ddp_bf16"):
        assert (
            r0[variant]["precision"] == r1[variant]["precision"] == ("bf16" if native else "fp32")
        )
        assert mean(r0[variant]["loss"][-5:]) < 0.1 * mean(r0[variant]["loss"][:5])
    if native:
        assert r0["fsdp_bf16"]["loss"] != pytest.approx(r0["full"]["loss"], rel=1e-6)
    assert r0["forced"]["precision"] == r1["forced"]["precision"] == "fp32"
    assert any("rank(s) [1]: simulated: no bf16 here" in m for m in fallback), fallback
    assert len(fallback) == (1 if native else 2)  # once per distinct reason, on rank 0 only
    assert not [m for m in r1["messages"] if "falls back" in m]


def test_resume_in_fresh_processes_from_host_local_dirs(
    trained: list[dict[str, Any]], resumed: list[dict[str, Any]]
) -> None:
    from tests.integration._backends_ranks import AFTER, VARIANTS, K

    r0, r1 = resumed
    for variant in VARIANTS:
        got, ref = r0[variant], trained[0][variant]
        assert got["loaded"] == r1[variant]["loaded"] == K
        assert got["hash"] == trained[0][f"{variant}/hash"], variant  # the very same parameters
        assert got["lr"] == pytest.approx(ref["lr"][K]), variant  # the schedule resumed too
        assert got["loss"] == pytest.approx(ref["loss"][K : K + AFTER], rel=1e-5), variant
        assert got["step"] == K + AFTER
    assert "global layout needs a checkpoint_dir shared by all ranks" in r0["global_local"]
    assert r0["global_local"] == r1["global_local"]  # every rank takes the same decision
    assert "saved by fsdp FULL_SHARD, this is fsdp NO_SHARD" in r0["other_sharding"]
    assert r0["other_sharding"] == r1["other_sharding"]
    assert r0["group_kept"] and r1["group_kept"]


def test_global_layout_reshards_to_one_rank_per_rank_refuses(
    ckpt_root: Path, trained: list[dict[str, Any]], resumed: list[dict[str, Any]]
) -> None:
    from tests.integration._backends_ranks import K

    (single,) = spawn("single", ckpt_root, world=1)
    assert single["loaded"] == K
    assert single["hash"] == trained[0]["full/hash"]
    assert single["state"]["world_size"] == 1 and single["state"]["step"] == K
    assert "saved by [2] ranks, this job has 1" in single["per_rank"]
    assert single["group_destroyed"]


# -- the pure parts, in process ----------------------------------------------------------


def test_choose_step() -> None:
    from corral.actors import backends

    choose = backends._choose_step
    assert choose([{}, {}], 2, "per_rank", None) is None
    assert choose([{4: 2, 8: 2}, {4: 2, 8: 2}], 2, "per_rank", None) == 8
    assert choose([{4: 2, 8: 2}, {4: 2}], 2, "per_rank", None) == 4  # 8 incomplete: skipped
    assert choose([{4: 2, 8: 2}, {4: 2, 8: 2}], 2, "per_rank", 4) == 4
    assert choose([{4: 2}, {4: 2}, {4: 2}], 3, "global", None) == 4  # DCP reshards
    with pytest.raises(ConfigError, match="same world size"):
        choose([{4: 2}], 1, "per_rank", None)
    with pytest.raises(ConfigError, match="shared by all ranks"):
        choose([{4: 2}, {}], 2, "global", None)
    with pytest.raises(ConfigError, match="missing on rank"):
        choose([{4: 2}, {}], 2, "per_rank", 4)


@pytest.mark.parametrize(
    ("option", "kwargs"),
    [
        ("sharding_strategy", {"sharding_strategy": "HYBRID"}),
        ("mixed_precision", {"mixed_precision": "fp8"}),
        ("max_grad_norm", {"max_grad_norm": 0}),
        ("total_steps", {"lr_schedule": "cosine"}),
        ("checkpoint_layout", {"checkpoint_layout": "nfs"}),
    ],
)
def test_bad_config_names_the_option(option: str, kwargs: dict[str, Any]) -> None:
    from corral.actors.backends import FSDPConfig

    with pytest.raises(ConfigError) as caught:
        FSDPConfig(**kwargs)
    assert caught.value.option == option


def test_lr_schedule_and_batch_forms() -> None:
    from corral.actors import backends
    from corral.actors.backends import FSDPConfig

    torch = require_torch()
    factor = backends._lr_lambda(FSDPConfig(warmup_steps=2, lr_schedule="linear", total_steps=12))
    assert [round(factor(s), 3) for s in (0, 1, 2, 7, 12, 20)] == [0.333, 0.667, 1.0, 0.5, 0.0, 0.0]
    cpu = torch.device("cpu")
    token_batch = {"input_ids": [[1, 2]], "labels": [[2, 3]], "loss_mask": [[1, 0]], "other": 1}
    inputs, _, extra = backends._split_batch(token_batch, cpu)
    assert inputs.dtype == torch.int64 and list(extra) == ["loss_mask"]
    assert backends._split_batch((torch.ones(2), torch.zeros(2)), cpu)[2] == {}
    with pytest.raises(ValueError, match="needs one of"):
        backends._split_batch({"inputs": [1]}, cpu)
