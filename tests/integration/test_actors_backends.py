"""DDP and FSDP2 training backends on 2 CPU ranks with gloo (spawned processes, no actors runtime).

One spawn trains every variant for 30 steps and saves at step K into
per-rank directories (two "hosts" without shared storage); fresh processes
then resume from them; a single process reloads the global layout at world size 1.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import socket
from collections.abc import Callable
from pathlib import Path
from statistics import mean
from typing import Any

import pytest

from tests.conftest import require_torch

require_torch()
pytestmark = pytest.mark.torch

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.multiprocessing as mp  # noqa: E402
from torch import nn  # noqa: E402

from corral.actors import backends  # noqa: E402
from corral.actors.backends import (  # noqa: E402
    DDPConfig,
    DDPTrainingBackend,
    FSDPConfig,
    FSDPTrainingBackend,
    TrainingBackend,
)
from corral.errors import ConfigError  # noqa: E402

STEPS = 30
K = 12  # the checkpoint step
AFTER = 5  # steps compared after resuming
VARIANTS = ("ddp", "full", "grad_op", "no_shard")
SCHEDULE: dict[str, Any] = {"warmup_steps": 3, "lr_schedule": "cosine", "total_steps": 40}
CLIP = 0.5  # low enough that some steps are clipped


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def batch(step: int, rank: int) -> dict[str, torch.Tensor]:
    """Rank ``rank``'s share of step ``step``: a learnable regression, the same in every run."""
    w = torch.randn(16, 1, generator=torch.Generator().manual_seed(1234)) / 4
    x = torch.randn(32, 16, generator=torch.Generator().manual_seed(10_000 + 100 * step + rank))
    return {"inputs": x, "labels": 2 * torch.sin(x @ w)}


def make_model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(
        nn.Linear(16, 64), nn.Tanh(), nn.Linear(64, 64), nn.Tanh(), nn.Linear(64, 1)
    )


def make_backend(variant: str, ckpt: Path, layout: str = "per_rank") -> TrainingBackend:
    """``ddp``/``full`` get an optimizer made before wrapping (seed style), the rest a factory."""
    model = make_model()
    bf16 = "bf16" if variant.endswith("bf16") else None
    common: dict[str, Any] = {**SCHEDULE, "max_grad_norm": CLIP, "mixed_precision": bf16}
    common["checkpoint_layout"] = layout
    if variant.startswith("ddp"):
        opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
        return DDPTrainingBackend(model, opt, nn.functional.mse_loss, ckpt, DDPConfig(**common))
    strategy = {"full": "FULL_SHARD", "grad_op": "SHARD_GRAD_OP", "no_shard": "NO_SHARD"}.get(
        variant, "FULL_SHARD"
    )
    config = FSDPConfig(sharding_strategy=strategy, **common)  # type: ignore[arg-type]
    opt_or_factory: Any = (
        torch.optim.AdamW(model.parameters(), lr=1e-2)
        if variant == "full"
        else (lambda params: torch.optim.AdamW(params, lr=1e-2))
    )
    return FSDPTrainingBackend(model, opt_or_factory, nn.functional.mse_loss, ckpt, config)


def state_hash(backend: TrainingBackend) -> str | None:
    """sha256 of the full model state on rank 0 (None elsewhere); collective."""
    state = backend.full_model_state_dict()
    if not state:
        return None
    digest = hashlib.sha256()
    for name in sorted(state):
        digest.update(name.encode() + state[name].float().numpy().tobytes())
    return digest.hexdigest()


def train(backend: TrainingBackend, start: int, stop: int, rank: int) -> tuple[list[float], ...]:
    losses, norms, lrs = [], [], []
    for step in range(start, stop):
        fb = backend.forward_backward(batch(step, rank))
        opt = backend.optim_step()
        assert opt["step"] == step + 1 and fb["examples"] == 64 and "tokens" not in fb
        losses.append(fb["loss"])
        norms.append(fb["grad_norm"])
        lrs.append(opt["lr"])
    return losses, norms, lrs


class Records(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


# -- what each rank runs (module level: spawn pickles it by name) ----------------------


def phase_train(rank: int, tmp: Path) -> dict[str, Any]:
    """Backends init the group from env; every variant trains, saving at K to host-local dirs."""
    host = tmp / f"host{rank}"
    out: dict[str, Any] = {}
    made = []
    for variant in VARIANTS:
        backend = make_backend(variant, host / variant)
        made.append(backend)
        first, norms, lrs = train(backend, 0, K, rank)
        backend.save_checkpoint(K)
        out[f"{variant}/hash"] = state_hash(backend)
        if variant == "full":
            shared = make_backend("full", tmp / "shared", layout="global")
            shared.load_checkpoint()  # nothing there yet
            shared.module.load_state_dict(backend.module.state_dict())  # same sharding
            shared.optimizer.load_state_dict(backend.optimizer.state_dict())
            shared.step = backend.step
            shared.save_checkpoint(K)  # the global layout, on a directory both ranks share
            local_global = make_backend("full", host / "global_local", layout="global")
            local_global.save_checkpoint(K)  # the global layout on host-local dirs (refused later)
            made += [shared, local_global]
        rest, more_norms, more_lrs = train(backend, K, STEPS, rank)
        out[variant] = {"loss": first + rest, "grad_norm": norms + more_norms, "lr": lrs + more_lrs}
    records = Records()
    logging.getLogger(backends.__name__).addHandler(records)
    for variant in ("fsdp_bf16", "ddp_bf16"):
        backend = make_backend(variant, host / variant)
        made.append(backend)
        losses, _, _ = train(backend, 0, STEPS, rank)
        out[variant] = {"loss": losses, "precision": backend.state()["mixed_precision"]}
    real_support = backends._bf16_support
    if rank == 1:  # one rank without bf16: every rank must fall back, rank 0 says why
        backends._bf16_support = lambda device: (False, "simulated: no bf16 here")
    backend = make_backend("fsdp_bf16", host / "forced")
    backends._bf16_support = real_support
    made.append(backend)
    losses, _, _ = train(backend, 0, 3, rank)
    out["forced"] = {"precision": backend.state()["mixed_precision"], "loss": losses}
    out["messages"] = records.messages
    out["state"] = made[1].state()
    for backend in made:
        backend.shutdown()
    out["group_destroyed"] = not dist.is_initialized()
    return out


def phase_resume(rank: int, tmp: Path) -> dict[str, Any]:
    """Fresh processes, a group the caller made: resume every variant from host-local dirs."""
    dist.init_process_group("gloo", init_method="env://")
    host = tmp / f"host{rank}"
    out: dict[str, Any] = {}
    for variant in VARIANTS:
        backend = make_backend(variant, host / variant)
        loaded = backend.load_checkpoint()
        digest, lr = state_hash(backend), backend.state()["lr"]
        losses, _, _ = train(backend, K, K + AFTER, rank)
        out[variant] = {"loaded": loaded, "hash": digest, "lr": lr, "loss": losses}
        out[variant]["step"] = backend.step
        backend.shutdown()
    for key, variant, ckpt, layout in [
        ("global_local", "full", host / "global_local", "global"),
        ("other_sharding", "no_shard", host / "full", "per_rank"),
    ]:
        try:
            make_backend(variant, ckpt, layout).load_checkpoint()
            out[key] = "loaded"
        except ConfigError as exc:
            out[key] = str(exc)
    out["group_kept"] = dist.is_initialized()  # the caller's group outlives the backends
    dist.destroy_process_group()
    return out


def phase_single(rank: int, tmp: Path) -> dict[str, Any]:
    """World size 1 (no launcher env): global layout reshards, per_rank refuses."""
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE"):
        os.environ.pop(name, None)
    out: dict[str, Any] = {}
    backend = make_backend("full", tmp / "shared", layout="global")
    out["loaded"] = backend.load_checkpoint()
    out["hash"] = state_hash(backend)
    out["state"] = backend.state()
    per_rank = make_backend("full", tmp / "host0" / "full")
    try:
        per_rank.load_checkpoint()
        out["per_rank"] = "loaded"
    except ConfigError as exc:
        out["per_rank"] = str(exc)
    per_rank.shutdown()
    backend.shutdown()
    out["group_destroyed"] = not dist.is_initialized()
    return out


PHASES: dict[str, Callable[[int, Path], dict[str, Any]]] = {
    "train": phase_train,
    "resume": phase_resume,
    "single": phase_single,
}


def _rank_main(rank: int, phase: str, tmp: str, world: int, port: int) -> None:
    torch.set_num_threads(1)
    os.environ.update(
        RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(world), LOCAL_WORLD_SIZE=str(world),
        MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port),
    )  # fmt: skip
    result = PHASES[phase](rank, Path(tmp))
    Path(tmp, f"{phase}.{rank}.json").write_text(json.dumps(result))


def spawn(phase: str, tmp: Path, world: int = 2) -> list[dict[str, Any]]:
    mp.spawn(_rank_main, args=(phase, str(tmp), world, free_port()), nprocs=world, join=True)
    return [json.loads((tmp / f"{phase}.{r}.json").read_text()) for r in range(world)]


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
    (single,) = spawn("single", ckpt_root, world=1)
    assert single["loaded"] == K
    assert single["hash"] == trained[0]["full/hash"]
    assert single["state"]["world_size"] == 1 and single["state"]["step"] == K
    assert "saved by [2] ranks, this job has 1" in single["per_rank"]
    assert single["group_destroyed"]


# -- the pure parts, in process ----------------------------------------------------------


def test_choose_step() -> None:
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
    with pytest.raises(ConfigError) as caught:
        FSDPConfig(**kwargs)
    assert caught.value.option == option


def test_lr_schedule_and_batch_forms() -> None:
    factor = backends._lr_lambda(FSDPConfig(warmup_steps=2, lr_schedule="linear", total_steps=12))
    assert [round(factor(s), 3) for s in (0, 1, 2, 7, 12, 20)] == [0.333, 0.667, 1.0, 0.5, 0.0, 0.0]
    cpu = torch.device("cpu")
    token_batch = {"input_ids": [[1, 2]], "labels": [[2, 3]], "loss_mask": [[1, 0]], "other": 1}
    inputs, _, extra = backends._split_batch(token_batch, cpu)
    assert inputs.dtype == torch.int64 and list(extra) == ["loss_mask"]
    assert backends._split_batch((torch.ones(2), torch.zeros(2)), cpu)[2] == {}
    with pytest.raises(ValueError, match="needs one of"):
        backends._split_batch({"inputs": [1]}, cpu)
