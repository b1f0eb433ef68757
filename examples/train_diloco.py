"""Train a small MLP with DiLoCo (semi-synchronous, in-place recovery), using the corral SDK.

Every replica group (a node under corral) trains its own copy of the model for H
steps, then the groups sync once: they average their pseudo-gradients and an outer
optimizer steps the shared weights (torchft's DiLoCo). H is chosen by corral from
the measured sync and step times unless ``--every`` gives it; ``--sync localsgd``
averages the weights instead. A killed group heals from a live peer at the next
sync, as in ``examples/train_ft.py``. Needs ``pip install 'corral[ft]'``::

    corral run --hosts hosts.txt --recovery in-place -- examples/train_diloco.py
    corral run --hosts local:2 --recovery in-place --launcher python -- examples/train_diloco.py

Every sync prints ``sync K at step S (every H) loss L``; at the end, after a final
sync, ``final loss L``: the shared model on the whole data set.
"""

from __future__ import annotations

import argparse
import sys
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
    p.add_argument("--steps", type=int, default=500, help="local steps in all")
    p.add_argument("--batch-size", type=int, default=128, help="global batch size")
    p.add_argument("--examples", type=int, default=4096, help="size of the data set")
    p.add_argument("--hidden", type=int, default=64)
    p.add_argument("--lr", type=float, default=3e-3, help="the inner optimizer's (AdamW)")
    p.add_argument("--sync", default="diloco", choices=("diloco", "localsgd"))
    p.add_argument("--every", type=int, default=None, help="steps between syncs (default: auto)")
    p.add_argument("--seed", type=int, default=0)
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    gen = torch.Generator().manual_seed(args.seed + 1)  # the same data in every group
    x = torch.randn(args.examples, IN_DIM, generator=gen)
    y = (x @ torch.randn(IN_DIM, CLASSES, generator=gen)).argmax(dim=1)
    torch.manual_seed(args.seed)
    model = nn.Sequential(
        nn.Linear(IN_DIM, args.hidden), nn.ReLU(), nn.Linear(args.hidden, CLASSES)
    )
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr)
    ft = sdk.fault_tolerant(
        model,
        optimizer,
        sync=args.sync,
        every=args.every,
        global_batch=args.batch_size,
        dataset_size=args.examples,
        seed=args.seed,
    )
    with ft:
        while ft.step < args.steps:
            syncs = ft.syncs
            optimizer.zero_grad()
            batch = ft.indices()  # this group's share of the step's batch
            loss = functional.cross_entropy(ft.model(x[batch]), y[batch])
            (loss * ft.loss_scale).backward()
            optimizer.step()  # a local step; every H steps also the sync
            if ft.syncs > syncs:
                print(
                    f"sync {ft.syncs} at step {ft.step} (every {ft.every}) loss {loss.item():.4f}",
                    flush=True,
                )
            sdk.report(ft.step, args.steps, loss=loss.item())
        ft.final_sync()  # every group ends with the shared model
        with torch.no_grad():
            final = functional.cross_entropy(model(x), y).item()
    print(f"final loss {final:.6f}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
