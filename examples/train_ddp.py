"""Train a small MLP with DistributedDataParallel, using the corral SDK.

The data are points labelled by a fixed random "teacher" network, so the task
is learnable and the loss drops fast. Runs under corral, plain ``torchrun``
(gloo on CPU, nccl on GPUs) or plain ``python`` (one process)::

    corral run --hosts local:2 --nproc-per-node 2 -- examples/train_ddp.py
    torchrun --nproc-per-node 2 examples/train_ddp.py
    python examples/train_ddp.py

Checkpoints go to ``--checkpoint-dir`` (default: ``$CORRAL_CHECKPOINT_DIR``, which
``corral run --checkpoint-dir`` sets; without either, none are written), every
``--checkpoint-every`` steps, by rank 0; a rerun resumes from the newest complete
one, and says so when that one already reached ``--steps``. ``--fail-at-step``
and friends inject a failure, to exercise a supervisor's teardown and restart.

With ``CORRAL_WORKLOAD_WEIGHTS`` (``corral run --calibration``) the global batch
is split in proportion to the ranks' weights (``sdk.WeightedDistributedSampler``,
the same number of steps on every rank) and each rank's loss is multiplied by
``sdk.loss_scale``, so the update is the one of the uniform split. With
``CORRAL_MICRO_BATCH_FITS`` too (a calibration that found how large a micro-batch
each rank fits), a rank whose batch exceeds its fit runs it as several
micro-batches and steps once (gradient accumulation, DDP's ``no_sync`` until the
last). Under
``corral calibrate`` (``CORRAL_CALIBRATE=1``) every rank trains on its own, with
no process group, DDP or checkpoints, so each runs at its own speed, and keeps
stepping past ``--steps`` until corral stops it at the end of the measuring
window (``--seconds``)::

    corral calibrate --hosts local:2 -- examples/train_ddp.py

Before the loop the long-lived objects (torch's) are frozen out of Python's
garbage collector (``gc.freeze()``): a full collection walks them otherwise,
every few steps, and stalls every rank at the next all-reduce.

Under calibration every other step runs a quarter of the batch
(``sdk.calibration_batch``), so corral separates a step's fixed cost from its
per-example cost and the split equalises whole step times.

Every step reports the examples it processed (``examples=``) and the seconds of
its forward pass (``busy=``, compute that waits for no other rank) for
throughput figures.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import os
import signal
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

try:
    from corral import sdk
except ImportError:  # running from a source checkout without corral installed
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
    from corral import sdk

import torch
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

IN_DIM, CLASSES, EXAMPLES = 16, 4, 4096
CALIBRATION_LOG_EVERY = 500  # steps between printed lines under corral calibrate


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=60, help="total optimisation steps")
    p.add_argument(
        "--checkpoint-dir",
        default=os.environ.get("CORRAL_CHECKPOINT_DIR") or None,
        help="default: $CORRAL_CHECKPOINT_DIR, else no checkpoints",
    )
    p.add_argument("--checkpoint-every", type=int, default=20, help="0 disables checkpoints")
    p.add_argument(
        "--ballast-mb",
        type=float,
        default=0.0,
        help="extra MB of data in each checkpoint (slower, bigger saves; tests)",
    )
    p.add_argument("--batch-size", type=int, default=256, help="global batch size")
    p.add_argument("--hidden", type=int, default=64, help="width of the MLP's hidden layers")
    p.add_argument("--examples", type=int, default=EXAMPLES, help="size of the data set")
    p.add_argument(
        "--lr", type=float, default=0.1, help="learning rate tuned for --base-batch-size"
    )
    p.add_argument(
        "--base-batch-size",
        type=int,
        default=128,
        help="global batch --lr was tuned for; the LR follows the global batch from there "
        "(never the world size alone: see corral.sdk.scale_config)",
    )
    p.add_argument("--lr-rule", choices=["linear", "sqrt", "none"], default="sqrt")
    p.add_argument("--log-every", type=int, default=10)
    p.add_argument("--sleep-per-step", type=float, default=0.0, help="seconds (slows the run)")
    p.add_argument("--seed", type=int, default=0)
    fail = p.add_argument_group("failure injection (tests)")
    fail.add_argument("--fail-at-step", type=int, default=None, help="fail before step K")
    fail.add_argument("--fail-rank", type=int, default=0, help="the global rank that fails")
    fail.add_argument(
        "--fail-mode",
        choices=["exit", "raise", "kill", "hang"],
        default="exit",
        help="exit: sys.exit; raise: an exception; kill: SIGKILL itself; hang: sleep forever",
    )
    fail.add_argument("--exit-code", type=int, default=1, help="exit status for --fail-mode exit")
    fail.add_argument(
        "--fail-on-attempt",
        type=int,
        default=0,
        help="fail only on this attempt (CORRAL_ATTEMPT); -1: on every attempt",
    )
    return p.parse_args(argv)


def make_dataset(seed: int, examples: int = EXAMPLES) -> TensorDataset:
    """Gaussian points labelled by a fixed random teacher MLP (same on every rank)."""
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(examples, IN_DIM, generator=gen)
    w1 = torch.randn(IN_DIM, 32, generator=gen) / IN_DIM**0.5
    w2 = torch.randn(32, CLASSES, generator=gen) / 32**0.5
    y = (torch.tanh(x @ w1) @ w2).argmax(dim=1)
    return TensorDataset(x, y)


def make_model(hidden: int = 64) -> nn.Module:
    return nn.Sequential(
        nn.Linear(IN_DIM, hidden),
        nn.ReLU(),
        nn.Linear(hidden, hidden),
        nn.ReLU(),
        nn.Linear(hidden, CLASSES),
    )


def batches(
    loader: DataLoader[Any],
    sampler: DistributedSampler[Any] | sdk.WeightedDistributedSampler,
    start: int,
) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """Endless batches, resuming at global step ``start`` (epoch and position)."""
    per_epoch = len(loader)
    epoch, skip = divmod(start, per_epoch)
    while True:
        sampler.set_epoch(epoch)
        for i, batch in enumerate(loader):
            if i >= skip:
                yield batch[0], batch[1]
        epoch, skip = epoch + 1, 0


def endless(loader: DataLoader[Any]) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """The loader's batches, epoch after epoch."""
    while True:
        for batch in loader:
            yield batch[0], batch[1]


@torch.no_grad()
def full_loss(model: nn.Module, data: TensorDataset) -> float:
    device = next(model.parameters()).device
    x, y = (t.to(device) for t in data.tensors)
    return float(nn.functional.cross_entropy(model(x), y))


def inject_failure(args: argparse.Namespace, rank: int, step: int) -> None:
    """The failure asked for on the command line (tests and benchmarks)."""
    if args.fail_mode == "raise":
        raise RuntimeError(f"injected failure at step {step} on rank {rank}")
    if args.fail_mode == "kill":
        print(f"rank {rank}: killing itself (SIGKILL) at step {step}", flush=True)
        os.kill(os.getpid(), signal.SIGKILL)
    if args.fail_mode == "hang":
        print(f"rank {rank}: hanging at step {step}", flush=True)
        hang_forever()
    print(f"rank {rank}: exiting with code {args.exit_code} at step {step}", flush=True)
    sys.exit(args.exit_code)


def hang_forever() -> None:
    """Stuck inside a training step (what hang detection must find)."""
    while True:
        time.sleep(3600)


def make_loader(
    data: TensorDataset,
    me: sdk.DistInfo,
    cfg: dict[str, Any],
    weights: tuple[float, ...] | None,
    seed: int,
) -> tuple[DistributedSampler[Any] | sdk.WeightedDistributedSampler, DataLoader[Any], float]:
    """This rank's sampler, loader and loss factor: the uniform split, or the weighted one."""
    if weights is None:
        uniform: DistributedSampler[Any] = DistributedSampler(
            data, num_replicas=me.world_size, rank=me.rank, shuffle=True, seed=seed, drop_last=True
        )
        loader = DataLoader(data, batch_size=cfg["batch_size"], sampler=uniform, drop_last=True)
        return uniform, loader, 1.0
    global_batch = cfg["global_batch_size"]
    sampler = sdk.WeightedDistributedSampler(
        data,
        num_replicas=me.world_size,
        rank=me.rank,
        weights=weights,
        shuffle=True,
        seed=seed,
        drop_last=True,
        global_batch=global_batch,
    )
    scale = sdk.loss_scale(global_batch, weights)  # every step is a full one (drop_last)
    micro = sampler.micro_sizes(0)  # more than one: its batch exceeds what it fits
    accumulation = f" as {len(micro)} micro-batches {list(micro)}" if len(micro) > 1 else ""
    print(
        f"rank {me.rank}: weighted split, weight {weights[me.rank]:.4f}, batch "
        f"{sampler.batch_size}{accumulation} of {global_batch}, {sampler.num_steps} steps per "
        f"epoch, loss x{scale:.4f}",
        flush=True,
    )
    return sampler, DataLoader(data, batch_sampler=sampler.batch_sampler()), scale


@sdk.record
def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    torch.set_num_threads(1)
    torch.manual_seed(args.seed)
    me = sdk.info()
    sdk.print_distributed_info()
    calibrating = sdk.calibrating()  # corral calibrate: each rank alone, at its own speed
    distributed = False if calibrating else sdk.init_distributed()
    total: int | None = args.steps
    if calibrating:  # a measurement, not a run: no checkpoints, and no last step (60 steps
        # take about a second; corral stops every rank once it has measured --seconds)
        args.checkpoint_dir, args.checkpoint_every = None, 0
        args.steps, total = sys.maxsize, None
        args.log_every = max(args.log_every, CALIBRATION_LOG_EVERY)
        if me.rank == 0:
            print("calibrating: training until corral calibrate stops this rank", flush=True)
    weights = sdk.workload_weights()
    cfg = sdk.scale_config(
        batch_size=args.batch_size,
        lr=args.lr,
        rule=args.lr_rule,
        base_batch_size=args.base_batch_size,
        # a weighted split uses the global batch exactly; the LR follows it alone
        world_size=1 if weights else None,
    )

    # init_distributed already selected this rank's GPU when there are GPUs.
    cuda = torch.cuda.is_available()
    device = torch.device("cuda", torch.cuda.current_device()) if cuda else torch.device("cpu")
    data = make_dataset(args.seed, args.examples)
    sampler, loader, scale = make_loader(data, me, cfg, weights, args.seed)

    # same seed everywhere; DDP broadcasts rank 0's anyway
    model = make_model(args.hidden).to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=cfg["lr"], momentum=0.9)
    initial_loss = full_loss(model, data)
    start = 0
    # every rank loads the newest complete checkpoint from its own disk (corral places it
    # on every host): no shared disk needed, nothing pickled across ranks
    state = sdk.resume(args.checkpoint_dir) if args.checkpoint_dir else None
    if state is not None:
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        start, initial_loss = int(state["step"]), float(state["initial_loss"])
        if start >= args.steps:  # a finished run: say so rather than train nothing silently
            if me.rank == 0:
                newest = sdk.latest_checkpoint(args.checkpoint_dir)  # a relative dir is the job's
                where = newest.parent if newest else os.path.abspath(args.checkpoint_dir)
                print(
                    f"already complete at step {start}/{args.steps}; nothing to do (delete "
                    f"{where} or pass --checkpoint-dir elsewhere to start fresh)",
                    flush=True,
                )
            sdk.barrier()
            sdk.cleanup()
            return
        if me.rank == 0:
            print(f"resumed from step {start} (world size {me.world_size})", flush=True)
    elif me.rank == 0 and not args.checkpoint_dir and args.checkpoint_every > 0:
        print("no --checkpoint-dir (nor $CORRAL_CHECKPOINT_DIR): checkpoints off", flush=True)
    net: nn.Module = model
    ddp: DistributedDataParallel | None = None
    if distributed:
        net = ddp = DistributedDataParallel(model, device_ids=[device.index] if cuda else None)
    micro = (
        list(sampler.micro_sizes(0)) if isinstance(sampler, sdk.WeightedDistributedSampler) else []
    )
    loss_fn = nn.CrossEntropyLoss()

    ballast = torch.zeros(int(args.ballast_mb * (1 << 20)) // 4, dtype=torch.float32)
    stream = batches(loader, sampler, start)
    # under calibration every other step loads and runs a quarter of the batch, so corral
    # tells the step's fixed cost from its per-example one (data loading included)
    quarter = sdk.calibration_batch(1, cfg["batch_size"])
    small = endless(DataLoader(data, batch_size=quarter, shuffle=True)) if calibrating else stream
    # torch's ~280k long-lived objects out of the garbage collector's way: the loader's
    # per-example tuples set off a full collection every few steps, which otherwise walks
    # them all (0.4-0.6 s on a busy core; a stall of every rank at the next all-reduce)
    gc.collect()
    gc.freeze()
    window: list[float] = []  # losses since the last printed line
    for step in range(start + 1, args.steps + 1):
        if (
            step == args.fail_at_step
            and me.rank == args.fail_rank
            and args.fail_on_attempt in (-1, me.attempt)
        ):
            inject_failure(args, me.rank, step)
        odd = sdk.calibration_batch(step, cfg["batch_size"]) != cfg["batch_size"]
        x, y = (t.to(device) for t in next(small if odd else stream))
        optimizer.zero_grad(set_to_none=True)
        parts = micro if len(micro) > 1 else [len(x)]  # gradient accumulation above the fit
        busy = value = 0.0
        for j, (xm, ym) in enumerate(
            zip(torch.split(x, parts), torch.split(y, parts), strict=True)
        ):
            last = j == len(parts) - 1
            with ddp.no_sync() if ddp is not None and not last else contextlib.nullcontext():
                began = time.perf_counter()
                loss = loss_fn(net(xm), ym)
                busy += time.perf_counter() - began  # the forward pass waits for no other rank
                # scale: 1, or this rank's weighted-split factor (a micro-batch: its part)
                (loss * (scale * len(xm) / len(x))).backward()
            value += loss.item() * len(xm) / len(x)
        optimizer.step()
        window.append(value)
        sdk.report(step, total, loss=value, examples=len(x), busy=busy)
        if me.rank == 0 and (step % args.log_every == 0 or step in (start + 1, args.steps)):
            mean = sum(window) / len(window)
            of = "" if total is None else f"/{total}"
            print(f"step {step}{of} loss {mean:.4f}", flush=True)
            window.clear()
        if args.checkpoint_dir and args.checkpoint_every > 0 and step % args.checkpoint_every == 0:
            sdk.save_checkpoint(
                {
                    "step": step,
                    "model": model.state_dict(),
                    "optimizer": optimizer.state_dict(),
                    "initial_loss": initial_loss,
                    "world_size": me.world_size,
                    "ballast": ballast,
                },
                args.checkpoint_dir,
                step,
            )
        if args.sleep_per_step > 0:
            time.sleep(args.sleep_per_step)

    if me.rank == 0:
        print(f"final loss {full_loss(model, data):.4f} (initial {initial_loss:.4f})", flush=True)
    sdk.barrier()
    sdk.cleanup()


if __name__ == "__main__":
    main()
