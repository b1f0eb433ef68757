"""Train a small MLP with in-place recovery (torchft), using the corral SDK.

Every replica group (a node under corral) trains a replica of the model; torchft's
Lighthouse forms a quorum of the live groups before every step. Kill a group and
the others go on at the next step with fewer participants; start it again and it
heals from a live peer's weights, then trains on. Needs ``pip install 'corral[ft]'``::

    corral run --hosts local:3 --recovery in-place -- examples/train_ft.py

By hand (one Lighthouse, then one ``torchrun`` per group, each with its own store)::

    torchft_lighthouse --min_replicas 1 --bind [::]:29510 &
    for g in 0 1 2; do
      TORCHFT_LIGHTHOUSE=http://localhost:29510 CORRAL_REPLICA_GROUP=$g \\
        python -m torch.distributed.run --nproc-per-node 1 --master-port $((29600 + g)) \\
        examples/train_ft.py &
    done

Each step's global batch (``--batch-size``) is split among the groups of the live
quorum (``sdk.fault_tolerant``'s ``indices()``; by ``CORRAL_WORKLOAD_WEIGHTS``
when set) and every rank's loss is scaled so the update is that of the whole
batch. Every committed step prints ``step N/TOTAL participants P loss L``; a step
the quorum did not commit is redone, whole, by the next quorum. At the end it prints
the replica's loss on the whole data set (``final loss L``). Disk checkpoints
(``--checkpoint-dir``, default ``$CORRAL_CHECKPOINT_DIR``) are for losing the
whole job: a rerun resumes from the newest one.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

try:
    from corral import sdk
except ImportError:  # running from a source checkout without corral installed
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
    from corral import sdk

import torch
from torch import nn
from torch.nn import functional

IN_DIM, CLASSES = 16, 4


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=200, help="total committed steps")
    p.add_argument("--batch-size", type=int, default=96, help="global batch size")
    p.add_argument("--examples", type=int, default=4096, help="size of the data set")
    p.add_argument("--hidden", type=int, default=64, help="width of the hidden layer")
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--seed", type=int, default=0, help="model init and data order")
    p.add_argument("--data-seed", type=int, default=None, help="the data set (default: --seed)")
    p.add_argument(
        "--step-sleep", type=float, default=0.0, help="extra seconds per step (slow steps)"
    )
    p.add_argument(
        "--degraded-step-sleep",
        type=float,
        default=0.0,
        help="extra seconds per step while fewer than all CORRAL_REPLICA_GROUPS groups take "
        "part (keeps a demo's or a test's degraded phase visible)",
    )
    p.add_argument(
        "--checkpoint-dir",
        default=os.environ.get("CORRAL_CHECKPOINT_DIR") or None,
        help="default: $CORRAL_CHECKPOINT_DIR, else no disk checkpoints",
    )
    p.add_argument("--checkpoint-every", type=int, default=50)
    return p.parse_args(argv)


def make_data(seed: int, examples: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Gaussian points labelled by a fixed random teacher network (same in every group)."""
    gen = torch.Generator().manual_seed(seed + 1)
    x = torch.randn(examples, IN_DIM, generator=gen)
    teacher = torch.randn(IN_DIM, CLASSES, generator=gen)
    return x, (x @ teacher).argmax(dim=1)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    x, y = make_data(args.seed if args.data_seed is None else args.data_seed, args.examples)
    torch.manual_seed(args.seed)
    model = nn.Sequential(
        nn.Linear(IN_DIM, args.hidden), nn.ReLU(), nn.Linear(args.hidden, CLASSES)
    )
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
    ft = sdk.fault_tolerant(
        model, optimizer, global_batch=args.batch_size, dataset_size=args.examples, seed=args.seed
    )
    with ft:
        if args.checkpoint_dir and (start := ft.resume(args.checkpoint_dir)):
            print(f"resumed at step {start}", flush=True)
        while ft.step < args.steps:
            before = ft.step
            ft.optimizer.zero_grad()  # starts the step's quorum
            batch = ft.indices()
            participants = ft.participants
            loss = functional.cross_entropy(ft.model(x[batch]), y[batch])
            (loss * ft.loss_scale).backward()
            ft.optimizer.step()  # steps only when the quorum commits
            degraded = ft.groups is not None and participants < ft.groups
            time.sleep(args.step_sleep + (args.degraded_step_sleep if degraded else 0.0))
            if ft.step == before:
                print(f"step {before + 1} not committed; redoing it", flush=True)
                continue
            print(
                f"step {ft.step}/{args.steps} participants {participants} loss {loss.item():.4f}",
                flush=True,
            )
            sdk.report(ft.step, args.steps, loss=loss.item())
            if args.checkpoint_dir and args.checkpoint_every:
                ft.save(args.checkpoint_dir, every=args.checkpoint_every)
        with torch.no_grad():  # the trained replica on the whole data set
            final = functional.cross_entropy(model(x), y).item()
    print(f"done at step {ft.step}", flush=True)
    print(f"final loss {final:.6f}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
