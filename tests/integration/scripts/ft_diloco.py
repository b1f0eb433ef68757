"""Test job for semi-synchronous training (``sdk.fault_tolerant(..., sync=...)``):
one replica group per node, a tiny model, gloo on CPU.

Every committed sync prints ``group G sync K at step S every H participants P``;
``--kill-group G --kill-at K`` SIGKILLs that group once, right after sync K or later
with every group in it and H settled (a marker file in the node's working dir keeps its restart
alive). Every group trains until ``--syncs`` syncs *and* a sync with every group
once H is settled (the survivors of a kill: also one without the lost group), so
nothing depends on timing. At the end: ``group G final step S syncs K every H lr L
weights D`` (D: a digest of the weights, equal after a sync everywhere).
An LR scheduler is carried (``state=``), so the groups compare digests after every
quorum change.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import signal
import sys
import time
from pathlib import Path

import torch
from torch import nn

from corral import sdk

parser = argparse.ArgumentParser()
parser.add_argument("--sync", default="diloco")
parser.add_argument("--every", default="")
parser.add_argument("--syncs", type=int, default=6)
parser.add_argument("--kill-group", type=int, default=-1)
parser.add_argument("--kill-at", type=int, default=3)
parser.add_argument("--sleep", type=float, default=0.02)
args = parser.parse_args()

group = int(os.environ["CORRAL_REPLICA_GROUP"])
groups = int(os.environ["CORRAL_REPLICA_GROUPS"])
torch.manual_seed(group)  # different starts: the first sync makes them one
model = nn.Linear(8, 1)
optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=10, gamma=0.9)
ft = sdk.fault_tolerant(
    model,
    optimizer,
    sync=args.sync,
    every=int(args.every) if args.every else None,
    state={"scheduler": scheduler},
    timeout=10,
    quorum_timeout=60,
)
data = torch.randn(64, 8, generator=torch.Generator().manual_seed(1))
target = data.sum(dim=1, keepdim=True)
marker = Path("killed-once")
everyone = lost = False


def finished() -> bool:
    if ft.syncs < args.syncs or not ft.every_settled:
        return False
    if ft.participants < groups:
        return False
    return args.kill_group < 0 or (marker.exists() if group == args.kill_group else lost)


while not finished():
    syncs = ft.syncs
    ft.optimizer.zero_grad()
    rows = [(ft.step * 8 + i) % 64 for i in range(8)]
    loss = nn.functional.mse_loss(ft.model(data[rows]), target[rows])
    loss.backward()
    ft.optimizer.step()  # every H steps: the sync
    scheduler.step()
    time.sleep(args.sleep)
    if ft.syncs == syncs:
        continue
    participants = ft.participants
    print(
        f"group {group} sync {ft.syncs} at step {ft.step} every {ft.every} "
        f"participants {participants}",
        flush=True,
    )
    sdk.report(step=ft.step, total=0, loss=loss.item())
    everyone = everyone or participants == groups
    lost = lost or (everyone and participants < groups)
    if (
        group == args.kill_group
        and ft.syncs >= args.kill_at
        and everyone
        and ft.every_settled
        and not marker.exists()
    ):
        marker.write_text("1")
        print(f"group {group} is about to be killed", file=sys.stderr, flush=True)
        os.kill(os.getpid(), signal.SIGKILL)
weights = hashlib.sha256(b"".join(p.detach().numpy().tobytes() for p in model.parameters()))
print(
    f"group {group} final step {ft.step} syncs {ft.syncs} every {ft.every} "
    f"lr {scheduler.get_last_lr()[0]:.6g} weights {weights.hexdigest()[:12]}",
    flush=True,
)
ft.shutdown()
