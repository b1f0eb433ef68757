"""Test job for the whole state through a heal (``sdk.fault_tolerant(..., state=)``):
an LR scheduler and a sampler (its position advances with every batch drawn) are
carried beside the model and the optimizer.

``--kill-group G --kill-at S`` SIGKILLs that group once, at step S or later after a
step with every group; its restart heals from the live peer. Every step prints
``group G step S lr L sampler P``; at the end ``group G final step S lr L sampler P``
(the survivors end only after the killed group is back, so nothing depends on timing;
their steps without it are 0.3 s apart, within the Lighthouse's 500 ms join
timeout, 0.05 s with every group).
``--late-group G --late-at S --progress PATH``: group G joins (and heals from the
other) only once it committed step S, which it says by creating PATH (a path both
groups reach: local nodes). ``--break NAME`` (scheduler or sampler) makes that
object's ``load_state_dict`` a no-op: a heal then leaves it stale, and the SDK must
fail naming it.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import time
from pathlib import Path
from typing import Any

import torch
from torch import nn

from corral import sdk

parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=12)
parser.add_argument("--kill-group", type=int, default=-1)
parser.add_argument("--kill-at", type=int, default=4)
parser.add_argument("--late-group", type=int, default=-1)
parser.add_argument("--late-at", type=int, default=4)
parser.add_argument("--progress", default="")
parser.add_argument("--break", dest="broken", default="")
args = parser.parse_args()

group = int(os.environ["CORRAL_REPLICA_GROUP"])
groups = int(os.environ["CORRAL_REPLICA_GROUPS"])


class Sampler:
    """A dataset position that advances with every batch drawn."""

    def __init__(self) -> None:
        self.position = 0

    def next(self, n: int) -> list[int]:
        start, self.position = self.position, self.position + 1
        return [(start * n + i) % 32 for i in range(n)]

    def state_dict(self) -> dict[str, Any]:
        return {"position": self.position}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.position = int(state["position"])


class NotHealed:
    """``obj`` whose load_state_dict forgets what it is given (a broken carry)."""

    def __init__(self, obj: Any) -> None:
        self.obj = obj

    def state_dict(self) -> Any:
        return self.obj.state_dict()

    def load_state_dict(self, state: Any) -> None:
        pass


torch.manual_seed(0)
model = nn.Linear(4, 1)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.95)
sampler = Sampler()
carried: dict[str, Any] = {"scheduler": scheduler, "sampler": sampler}
if args.broken:
    carried[args.broken] = NotHealed(carried[args.broken])
if group == args.late_group:
    while not Path(args.progress).exists():  # not yet a torchft replica: no quorum waits
        time.sleep(0.2)
ft = sdk.fault_tolerant(model, optimizer, state=carried, timeout=10, quorum_timeout=60)
data = torch.randn(32, 4)
target = data.sum(dim=1, keepdim=True)
participants, everyone, loss_seen = 0, False, False
marker = Path("killed-once")  # the node's own working dir: the restart skips it


def finished() -> bool:
    """Trained enough with every group, and (with --kill-group) past the loss: the
    survivors saw the group go and come back; the killed group is its restart."""
    if ft.step < args.steps or participants < groups:
        return False
    return args.kill_group < 0 or (marker.exists() if group == args.kill_group else loss_seen)


while not finished():
    step = ft.step
    ft.optimizer.zero_grad()
    batch = sampler.next(8)
    loss = nn.functional.mse_loss(ft.model(data[batch]), target[batch])
    loss.backward()
    ft.optimizer.step()
    participants = ft.participants
    if ft.step > step:  # committed: the schedule moves on
        scheduler.step()
        lr = scheduler.get_last_lr()[0]
        print(f"group {group} step {ft.step} lr {lr:.6g} sampler {sampler.position}", flush=True)
        sdk.report(step=ft.step, total=args.steps)
    if args.progress and group != args.late_group and ft.step >= args.late_at:
        Path(args.progress).touch()
    loss_seen = loss_seen or (everyone and participants < groups)
    everyone = everyone or participants == groups
    if group == args.kill_group and step >= args.kill_at and everyone and not marker.exists():
        marker.write_text("1")
        print(f"group {group} is about to be killed", file=sys.stderr, flush=True)
        os.kill(os.getpid(), signal.SIGKILL)
    # while a group is away (or not yet there) the others wait in sleep, not in steps
    time.sleep(0.05 if participants == groups else 0.3)
lr = scheduler.get_last_lr()[0]
print(f"group {group} final step {ft.step} lr {lr:.6g} sampler {sampler.position}", flush=True)
ft.shutdown()
