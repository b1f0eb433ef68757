"""The benchmark job of ``bench_inplace.py``: the same model, data, step count and
step time under ``--recovery restart`` and ``--recovery in-place``.

One rank per node, a small MLP over gloo on CPU, ``--sleep`` seconds of extra work
per step. Each committed step prints ``step S`` (stdout, flushed). ``--kill-node N
--kill-at K``: node N's rank prints ``killing itself at step K`` and SIGKILLs itself,
once (a marker file under ``--marker-dir`` keeps its restart alive).

* restart (no ``CORRAL_REPLICA_GROUP``): torch DDP over the job's process group;
  rank 0 saves a checkpoint every ``--checkpoint-every`` steps to
  ``--checkpoint-dir`` and every attempt resumes from it (``resumed from step S``).
* in-place (``CORRAL_REPLICA_GROUP`` set by corral): torchft's Manager, DDP and
  Optimizer; the node trains until ``--steps`` *and* a step with every group in
  the quorum (so a lost group is back before the end).
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import time
from datetime import timedelta
from pathlib import Path

import torch
from torch import nn

parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=60)
parser.add_argument("--sleep", type=float, default=0.1)
parser.add_argument("--kill-node", type=int, default=-1)
parser.add_argument("--kill-at", type=int, default=30)
parser.add_argument("--marker-dir", default="")
parser.add_argument("--checkpoint-dir", default="")
parser.add_argument("--checkpoint-every", type=int, default=20)
args = parser.parse_args()

in_place = "CORRAL_REPLICA_GROUP" in os.environ
node = int(os.environ["CORRAL_REPLICA_GROUP"] if in_place else os.environ.get("NODE_RANK", "0"))
torch.manual_seed(0)
model = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 1))
inner = torch.optim.SGD(model.parameters(), lr=0.01)
data = torch.randn(256, 32)
target = data.sum(dim=1, keepdim=True)
marker = Path(args.marker_dir or ".") / f"killed-{node}"


def maybe_die(step: int) -> None:
    if node == args.kill_node and step >= args.kill_at and not marker.exists():
        marker.write_text(str(step))
        print(f"killing itself at step {step}", flush=True)
        os.kill(os.getpid(), signal.SIGKILL)


def work(forward: nn.Module) -> float:
    loss = nn.functional.mse_loss(forward(data), target)
    loss.backward()
    time.sleep(args.sleep)
    return float(loss)


if in_place:
    from torchft import DistributedDataParallel, Manager, Optimizer, ProcessGroupGloo

    groups = int(os.environ["CORRAL_REPLICA_GROUPS"])

    def state_dict() -> dict[str, object]:
        return {"model": model.state_dict(), "optim": inner.state_dict()}

    def load_state_dict(sd: dict[str, object]) -> None:
        model.load_state_dict(sd["model"])  # type: ignore[arg-type]
        inner.load_state_dict(sd["optim"])  # type: ignore[arg-type]

    manager = Manager(
        pg=ProcessGroupGloo(timeout=timedelta(seconds=10)),
        min_replica_size=int(os.environ.get("CORRAL_MIN_REPLICAS", "1")),
        load_state_dict=load_state_dict,
        state_dict=state_dict,
        replica_id=f"corral_{node}",
        timeout=timedelta(seconds=10),
        quorum_timeout=timedelta(seconds=60),
        hostname=os.environ["MASTER_ADDR"],
    )
    ddp = DistributedDataParallel(manager, model)
    optimizer = Optimizer(manager, inner)
    participants = 0
    while manager.current_step() < args.steps or participants < groups:
        before = manager.current_step()
        maybe_die(before)
        optimizer.zero_grad()
        work(ddp)
        optimizer.step()
        participants = manager.num_participants()
        if manager.current_step() > before:
            print(f"step {manager.current_step()} participants {participants}", flush=True)
    manager.shutdown(wait=False)
    sys.exit(0)

import torch.distributed as dist  # noqa: E402
from torch.nn.parallel import DistributedDataParallel as DDP  # noqa: E402

dist.init_process_group("gloo", timeout=timedelta(seconds=30))
ddp_model = DDP(model)
ckpt = Path(args.checkpoint_dir) / "ckpt.pt" if args.checkpoint_dir else None
step = 0
if ckpt is not None and ckpt.exists():
    saved = torch.load(ckpt, weights_only=True)
    model.load_state_dict(saved["model"])
    inner.load_state_dict(saved["optim"])
    step = int(saved["step"])
    print(f"resumed from step {step}", flush=True)
while step < args.steps:
    maybe_die(step)
    inner.zero_grad()
    work(ddp_model)
    inner.step()
    step += 1
    print(f"step {step}", flush=True)
    if ckpt is not None and dist.get_rank() == 0 and step % args.checkpoint_every == 0:
        tmp = ckpt.with_suffix(".tmp")
        torch.save({"model": model.state_dict(), "optim": inner.state_dict(), "step": step}, tmp)
        tmp.replace(ckpt)
dist.destroy_process_group()
