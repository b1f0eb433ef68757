"""Train a tiny transformer with FSDP on every node, driven by one coordinator (corral.actors).

This program is both sides. Run as a program it is the coordinator: it starts
2 workers on each node, sends every worker its rendezvous (NCCL) config, waits
until each has built the model, then drives training step by step with
messages (``forward_backward``, ``optim_step``, ``save_checkpoint``,
``shutdown``). The workers load this same file as a module (without running its
``__main__`` block) and run :func:`training_work_fn`::

    python examples/actors_fsdp.py                          # local:2, 2 workers each, CPU
    python examples/actors_fsdp.py --backend ddp --steps 50
    python examples/actors_fsdp.py --hosts hosts.txt --ssh-config ~/.ssh/config

With ``--hosts`` the file must be at the same path on every host (a shared home,
or a synced checkout), with corral and torch installed there. No port is opened
for the workers: each talks to the coordinator over its SSH session. The workers
talk to each other through torch.distributed (gloo on CPU, nccl on GPUs) at
``MASTER_ADDR:MASTER_PORT`` (the first host, port 29500 over SSH).

The task: sequences that walk a hidden permutation of a 32-token vocabulary
(each token's successor is fixed), so next-token prediction is learnable and
the loss falls from ln(32) ~ 3.5 towards 0 within ~30 steps.

After the last step every rank saves its shards of the model, optimizer and LR
schedule to ``--checkpoint-dir`` (default ``runs/actors_fsdp/<backend>``; on each
host for its own ranks). A rerun with the same directory resumes from there and
says so: ``--steps`` is the total, so ``--steps 40`` after a 30-step run trains
steps 31 to 40.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from corral.actors import Cluster, NCCLConfig, setup_nccl_env
from corral.actors.backends import (
    DDPConfig,
    DDPTrainingBackend,
    FSDPConfig,
    FSDPTrainingBackend,
    TrainingBackend,
)
from corral.actors.worker import CoordinatorHandle
from corral.errors import CorralError
from corral.transport.options import SshOptions

VOCAB, SEQ_LEN, DIM, LAYERS, HEADS = 32, 32, 64, 2, 4

# ============================================================================
# The task and the model (used on both sides)
# ============================================================================


def make_batch(step: int, seed: int, size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Step ``step``'s global batch: ``size`` sequences that walk a hidden permutation
    (fixed by ``seed``) from random starts; the labels are the inputs shifted by one."""
    successor = torch.randperm(VOCAB, generator=torch.Generator().manual_seed(seed))
    starts = torch.Generator().manual_seed(seed * 1_000_003 + step)
    tokens = [torch.randint(0, VOCAB, (size,), generator=starts)]
    for _ in range(SEQ_LEN):
        tokens.append(successor[tokens[-1]])
    walk = torch.stack(tokens, dim=1)
    return walk[:, :-1], walk[:, 1:]


class TinyLM(nn.Module):
    """A causal transformer language model: embeddings, pre-norm blocks, a linear head."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCAB, DIM)
        self.position = nn.Embedding(SEQ_LEN, DIM)
        self.blocks = nn.ModuleList(
            nn.TransformerEncoderLayer(
                DIM, HEADS, 4 * DIM, dropout=0.0, batch_first=True, norm_first=True
            )
            for _ in range(LAYERS)
        )
        self.norm = nn.LayerNorm(DIM)
        self.head = nn.Linear(DIM, VOCAB)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        length = input_ids.shape[1]
        positions = torch.arange(length, device=input_ids.device)
        x = self.embed(input_ids) + self.position(positions)
        causal = nn.Transformer.generate_square_subsequent_mask(length, device=x.device)
        for block in self.blocks:
            x = block(x, src_mask=causal, is_causal=True)
        # One row of logits per position: (batch * length, VOCAB). Flattening before
        # the head means no module returns a view (FSDP2 warns about those).
        logits: torch.Tensor = self.head(self.norm(x).flatten(0, 1))
        return logits


def next_token_loss(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    return nn.functional.cross_entropy(logits, labels.flatten())


@dataclass
class Settings:
    """What the coordinator tells every worker besides its NCCL config."""

    backend: str  # "fsdp" or "ddp"
    checkpoint_dir: str
    seed: int
    lr: float
    warmup_steps: int
    bf16: bool
    device: str  # "auto", "cpu" or "cuda"
    threads: int | None  # torch intra-op threads per worker (None: host CPUs / its workers)


# ============================================================================
# The worker: runs in every worker process, on every node
# ============================================================================


def pick_device(wanted: str, local_world_size: int) -> str:
    """``auto``: CUDA when this host has a GPU for each of its workers, else CPU."""
    if wanted != "auto":
        return wanted
    return "cuda" if torch.cuda.device_count() >= local_world_size else "cpu"


def make_backend(settings: Settings, device: str) -> TrainingBackend:
    """The model (the same initial weights on every rank) under DDP or FSDP2."""
    torch.manual_seed(settings.seed)
    model = TinyLM()
    common: dict[str, Any] = {
        "device": device,
        "mixed_precision": "bf16" if settings.bf16 else None,
        "warmup_steps": settings.warmup_steps,
        "max_grad_norm": 1.0,
    }

    def optimizer(params: Any) -> torch.optim.Optimizer:
        return torch.optim.AdamW(params, lr=settings.lr, weight_decay=0.01)

    if settings.backend == "ddp":
        return DDPTrainingBackend(
            model, optimizer, next_token_loss, settings.checkpoint_dir, DDPConfig(**common)
        )
    config = FSDPConfig(sharding_strategy="FULL_SHARD", **common)
    return FSDPTrainingBackend(model, optimizer, next_token_loss, settings.checkpoint_dir, config)


def training_work_fn(handle: CoordinatorHandle) -> None:
    """One worker: join the process group, build the backend, obey messages until shutdown."""
    # 1. Rendezvous: the coordinator sends this worker's NCCL config and the settings.
    setup = handle.recv()
    config = NCCLConfig(**setup["nccl"])
    settings: Settings = setup["settings"]
    setup_nccl_env(config)
    threads = settings.threads or max(1, (os.cpu_count() or 1) // config.local_world_size)
    torch.set_num_threads(threads)

    # 2. torch.distributed, then the model under DDP or FSDP2, resumed if a checkpoint is there.
    device = pick_device(settings.device, config.local_world_size)
    dist.init_process_group("nccl" if device == "cuda" else "gloo", init_method="env://")
    backend = make_backend(settings, device)
    backend.load_checkpoint()  # the latest complete one, if any (None: start at step 0)
    state = backend.state()  # backend, device, mixed_precision, step, last_checkpoint, ...
    print(
        f"rank {config.rank}/{config.world_size}: {state['backend']} on {state['device']}, "
        f"{threads} torch thread(s)"
    )
    handle.send({"status": "ready", **state})

    # 3. The message loop.
    try:
        while True:
            msg = handle.recv()
            cmd = msg["cmd"]
            if cmd == "forward_backward":
                handle.send(backend.forward_backward(msg["batch"]))
            elif cmd == "optim_step":
                handle.send(backend.optim_step())
            elif cmd == "save_checkpoint":
                handle.send(str(backend.save_checkpoint(msg["step"])))
            elif cmd == "shutdown":
                break
            else:
                raise ValueError(f"unknown command {cmd!r}")
    finally:
        backend.shutdown()
        if dist.is_initialized():
            dist.destroy_process_group()
    handle.send({"status": "exited", "step": backend.step})


# ============================================================================
# The coordinator
# ============================================================================


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--hosts", default="local:2", help="a corral hostfile, h1,h2 or local:N")
    p.add_argument("--workers-per-host", type=int, default=2)
    p.add_argument("--ssh-config", default=None, help="an ssh_config file for the hosts")
    p.add_argument("--backend", choices=["fsdp", "ddp"], default="fsdp")
    p.add_argument("--steps", type=int, default=30, help="total optimizer steps")
    p.add_argument("--batch-size", type=int, default=32, help="global batch (sequences)")
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--warmup-steps", type=int, default=5)
    p.add_argument("--seed", type=int, default=0, help="the model's init and the data")
    p.add_argument("--bf16", action="store_true", help="bf16 compute where supported")
    p.add_argument(
        "--threads",
        type=int,
        default=None,
        help="torch threads per worker (default: the host's CPUs / its workers; local:N "
        "nodes share this machine's CPUs)",
    )
    p.add_argument(
        "--device",
        choices=["auto", "cpu", "cuda"],
        default="auto",
        help="auto: CUDA where a host has a GPU for each of its workers (nccl), else CPU (gloo)",
    )
    p.add_argument(
        "--checkpoint-dir",
        default=None,
        help="default runs/actors_fsdp/<backend>; each host writes its own ranks' shards "
        "there, and a rerun resumes from it",
    )
    p.add_argument("--run-dir", default="runs", help="where the workers' log files go")
    p.add_argument("--timeout", type=float, default=300.0, help="seconds per message round")
    args = p.parse_args(argv)
    if args.threads is not None and args.threads < 1:
        p.error(f"--threads must be at least 1, not {args.threads}")
    return args


def start_workers(cluster: Cluster, args: argparse.Namespace) -> int:
    """Start the workers, send each its NCCL config, wait until all are ready: the step
    to start from (the checkpoint's, when there is one)."""
    # Every worker runs training_work_fn: this file, loaded on each host as a module.
    workers = cluster.start("__main__.training_work_fn", wait_time=120)
    hosts = ", ".join(dict.fromkeys(w.host for w in workers))
    print(f"Cluster {cluster.job_id}: {len(workers)} workers on {hosts}")

    settings = Settings(
        backend=args.backend,
        checkpoint_dir=str(Path(args.checkpoint_dir).absolute()),
        seed=args.seed,
        lr=args.lr,
        warmup_steps=args.warmup_steps,
        bf16=args.bf16,
        device=args.device,
        threads=args.threads,
    )
    # cluster.nccl_configs(): one per worker, with each node's interface toward the master
    for worker, config in zip(workers, cluster.nccl_configs(), strict=True):
        worker.send({"nccl": config.to_dict(), "settings": settings})
    ready = cluster.gather(timeout=args.timeout)  # one "ready" per worker, in rank order
    first = ready[0]
    print(
        f"All {len(ready)} workers ready: {first['backend']} on {first['device']}, "
        f"precision {first['mixed_precision']}"
    )
    if first["last_checkpoint"] is not None:
        print(f"Resumed from checkpoint step {first['step']} in {settings.checkpoint_dir}")
    step: int = first["step"]
    return step


def train(cluster: Cluster, args: argparse.Namespace, start: int) -> None:
    """Steps ``start + 1`` to ``--steps``, then a checkpoint."""
    if start >= args.steps:
        print(f"Already at step {start}: nothing to train for --steps {args.steps}")
        return
    workers = cluster.workers
    for step in range(start, args.steps):
        t0 = time.perf_counter()
        input_ids, labels = make_batch(step, args.seed, args.batch_size)
        # Each worker gets its own slice of the global batch.
        n = len(workers)
        shards = zip(workers, input_ids.tensor_split(n), labels.tensor_split(n), strict=True)
        for worker, ids, labs in shards:
            worker.send({"cmd": "forward_backward", "batch": {"input_ids": ids, "labels": labs}})
        metrics = cluster.gather(timeout=args.timeout)  # the loss is the mean over ranks
        updated = cluster.call({"cmd": "optim_step"}, timeout=args.timeout)
        print(
            f"Step {updated[0]['step']}: loss={metrics[0]['loss']:.4f}, "
            f"grad_norm={metrics[0]['grad_norm']:.3f}, lr={updated[0]['lr']:.2e} "
            f"({time.perf_counter() - t0:.2f} s)",
            flush=True,
        )
    paths = cluster.call({"cmd": "save_checkpoint", "step": args.steps}, timeout=args.timeout)
    print(f"Saved checkpoint step {args.steps}: {Path(paths[0]).parent}")


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    args.checkpoint_dir = args.checkpoint_dir or f"runs/actors_fsdp/{args.backend}"
    cluster = Cluster.from_hosts(
        args.hosts,
        workers_per_host=args.workers_per_host,
        ssh=SshOptions(config=args.ssh_config),
        run_dir=args.run_dir,
    )
    try:
        train(cluster, args, start_workers(cluster, args))
        print("Shutting down...")
        cluster.call({"cmd": "shutdown"}, timeout=args.timeout)  # each leaves its group, exits
    except CorralError as exc:  # a named failure: which worker(s), and why
        print(f"error: {exc}", file=sys.stderr)
        return 1
    finally:
        cluster.stop()  # waits for every worker process to end (kills stragglers), on every host
    print("Done.")
    return 0


if __name__ == "__main__":
    sys.exit(main())
