"""What each rank of tests/integration/test_actors_backends.py runs (torch; imported lazily).

``spawn_ranks`` (``torch.multiprocessing``) pickles ``rank_main`` by name, so it
lives at module level here, out of the test module: importing the test module (every
xdist worker collects it) does not import torch.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from corral.actors import backends
from corral.actors.backends import (
    DDPConfig,
    DDPTrainingBackend,
    FSDPConfig,
    FSDPTrainingBackend,
    TrainingBackend,
)
from corral.errors import ConfigError
from tests.integration.conftest import spawn_ranks

STEPS = 30
K = 12  # the checkpoint step
AFTER = 5  # steps compared after resuming
VARIANTS = ("ddp", "full", "grad_op", "no_shard")
SCHEDULE: dict[str, Any] = {"warmup_steps": 3, "lr_schedule": "cosine", "total_steps": 40}
CLIP = 0.5  # low enough that some steps are clipped


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


def rank_main(rank: int, phase: str, tmp: str, world: int, port: int) -> None:
    torch.set_num_threads(1)
    os.environ.update(
        RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(world), LOCAL_WORLD_SIZE=str(world),
        MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port),
    )  # fmt: skip
    result = PHASES[phase](rank, Path(tmp))
    Path(tmp, f"{phase}.{rank}.json").write_text(json.dumps(result))


def spawn(phase: str, tmp: Path, world: int, port: int) -> list[dict[str, Any]]:
    """Run ``phase`` on ``world`` spawned ranks; their results, by rank."""
    spawn_ranks(rank_main, (phase, str(tmp), world, port), world)
    return [json.loads((tmp / f"{phase}.{r}.json").read_text()) for r in range(world)]
