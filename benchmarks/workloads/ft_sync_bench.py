"""The benchmark job of ``bench_diloco.py``: the same model, data and sample count
under ``sdk.fault_tolerant(sync="ddp")`` (torchft's quorum and all-reduce every
step) and ``sync="diloco"`` (H chosen by corral), one rank per replica group.

A 3-layer MLP (``--hidden``) classifies Gaussian points labelled by a fixed random
teacher network (the data set is the same for every seed; ``--seed`` sets the model's
initial weights and the data order). Each step reads ``--batch-size`` examples in
all: every group its share (``ft.indices()``), so both modes see the same samples
per step, ``--steps`` steps. AdamW inner optimizer (DiLoCo's recipe) in both modes.

Prints ``steps N in T s`` (from the end of step ``--warmup``, or the first after it,
to the end of the last: start-up, the first quorum and the first heal left out, the
probe syncs of DiLoCo kept), ``every H syncs K`` (H 1 for DDP) and, after a final
sync (DiLoCo), ``final loss L``: the group's model on the whole data set.
"""

from __future__ import annotations

import argparse
import time

import torch
from torch import nn
from torch.nn import functional

from corral import sdk

IN_DIM, CLASSES = 32, 8

parser = argparse.ArgumentParser()
parser.add_argument("--sync", default="ddp", choices=("ddp", "diloco", "localsgd"))
parser.add_argument("--steps", type=int, default=300)
parser.add_argument("--warmup", type=int, default=5)
parser.add_argument("--batch-size", type=int, default=256)
parser.add_argument("--examples", type=int, default=8192)
parser.add_argument("--hidden", type=int, default=128)
parser.add_argument("--lr", type=float, default=3e-3)
parser.add_argument("--seed", type=int, default=0)
parser.add_argument("--every", type=int, default=None, help="default: corral chooses")
parser.add_argument("--outer-lr", type=float, default=0.7)
parser.add_argument("--outer-momentum", type=float, default=0.9)
parser.add_argument("--min-replicas", type=int, default=2, help="no group trains alone")
args = parser.parse_args()

torch.set_num_threads(1)
gen = torch.Generator().manual_seed(12345)  # the data set: the same for every seed
x = torch.randn(args.examples, IN_DIM, generator=gen)
teacher = nn.Sequential(nn.Linear(IN_DIM, 64), nn.Tanh(), nn.Linear(64, CLASSES))
with torch.no_grad():
    for p in teacher.parameters():
        p.copy_(torch.randn(p.shape, generator=gen))
    y = teacher(x).argmax(dim=1)
torch.manual_seed(args.seed)
model = nn.Sequential(
    nn.Linear(IN_DIM, args.hidden),
    nn.ReLU(),
    nn.Linear(args.hidden, args.hidden),
    nn.ReLU(),
    nn.Linear(args.hidden, CLASSES),
)
optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr)
outer = None
if args.sync == "diloco":
    outer = torch.optim.SGD(
        model.parameters(), lr=args.outer_lr, momentum=args.outer_momentum, nesterov=True
    )
ft = sdk.fault_tolerant(
    model,
    optimizer,
    global_batch=args.batch_size,
    dataset_size=args.examples,
    seed=args.seed,
    sync=args.sync,
    every=args.every,
    outer_optimizer=outer,
    min_replicas=args.min_replicas,
    quorum_timeout=120,
)
began: tuple[int, float] | None = None
with ft:
    while ft.step < args.steps:
        before = ft.step
        ft.optimizer.zero_grad()
        batch = ft.indices()
        loss = functional.cross_entropy(ft.model(x[batch]), y[batch])
        (loss * ft.loss_scale).backward()
        ft.optimizer.step()
        if began is None and ft.step > before and ft.step >= args.warmup:
            began = (ft.step, time.perf_counter())
    ended = time.perf_counter()
    ft.final_sync()  # DiLoCo: every group ends with the shared model
    with torch.no_grad():
        final = functional.cross_entropy(model(x), y).item()
assert began is not None
print(f"steps {args.steps - began[0]} in {ended - began[1]:.4f} s", flush=True)
print(f"every {ft.every} syncs {ft.syncs}", flush=True)
print(f"final loss {final:.6f}", flush=True)
