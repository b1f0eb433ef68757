"""The benchmark job of ``bench_inplace.py``: the same model, data, step count and
step time under ``--recovery restart`` and ``--recovery in-place``.

One rank per node, a small MLP over gloo on CPU, ``--sleep`` seconds of extra work
per step. Each committed step prints ``step S`` (stdout, flushed). ``--kill-node N
--kill-at K``: node N's rank prints ``killing itself at step K`` and SIGKILLs itself,
once (a marker file under ``--marker-dir`` keeps its restart alive). Each step line
also says ``wait W``: the seconds of its forward and backward (where the gradient's
all-reduce waits for the quorum, and the process group is reconfigured after a
quorum change), the sleep not counted; in-place ones ``quorum Q`` too: the seconds
from ``zero_grad()`` to the step's data (torchft's asynchronous quorum returns at
once; the SDK's ``ft.indices()`` waits for it). At the end each rank prints ``cpu C per step``:
its process CPU seconds (every thread) per step from step 10 on.

* restart (no ``CORRAL_REPLICA_GROUP``): torch DDP over the job's process group;
  rank 0 saves a checkpoint every ``--checkpoint-every`` steps to
  ``--checkpoint-dir`` and every attempt resumes from it (``resumed from step S``).
* in-place (``CORRAL_REPLICA_GROUP`` set by corral): torchft's Manager, DDP and
  Optimizer; the node trains until ``--steps`` *and* a step with every group in
  the quorum (so a lost group is back before the end). With ``--sdk`` the same
  through corral's ``sdk.fault_tolerant`` and its documented loop (each group reads
  its share of the batch, ``ft.indices()``, scaled by ``ft.loss_scale``).
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
parser.add_argument("--sdk", action="store_true", help="in-place: through sdk.fault_tolerant")
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


WARM = 10  # steps before the CPU per step is counted
cpu_from: list[tuple[float, int]] = []


def work(forward: nn.Module, rows: object = slice(None), scale: float = 1.0) -> float:
    """One step's forward and backward, then the extra work; the seconds of the first."""
    start = time.monotonic()
    loss = nn.functional.mse_loss(forward(data[rows]), target[rows])  # type: ignore[index]
    (loss * scale).backward()
    waited = time.monotonic() - start
    time.sleep(args.sleep)
    return waited


def count_cpu(step: int) -> None:
    if step >= WARM and not cpu_from:
        cpu_from.append((time.process_time(), step))


def cpu_line(step: int) -> None:
    if cpu_from and step > cpu_from[0][1]:
        per_step = (time.process_time() - cpu_from[0][0]) / (step - cpu_from[0][1])
        print(f"cpu {per_step:.6f} per step", flush=True)


if in_place and args.sdk:
    from corral import sdk

    groups = int(os.environ["CORRAL_REPLICA_GROUPS"])
    ft = sdk.fault_tolerant(
        model, inner, global_batch=len(data), dataset_size=len(data), shuffle=False, timeout=10
    )
    participants = 0
    while ft.step < args.steps or participants < groups:
        before = ft.step
        maybe_die(before)
        began = time.monotonic()
        ft.optimizer.zero_grad()
        rows = ft.indices()
        quorum = time.monotonic() - began
        waited = work(ft.model, rows, ft.loss_scale)
        ft.optimizer.step()
        participants = ft.participants
        if ft.step > before:
            print(
                f"step {ft.step} participants {participants} quorum {quorum:.4f} wait {waited:.4f}",
                flush=True,
            )
            count_cpu(ft.step)
    cpu_line(ft.step)
    ft.shutdown()
    sys.exit(0)

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
        began = time.monotonic()
        optimizer.zero_grad()
        quorum = time.monotonic() - began
        waited = work(ddp)
        optimizer.step()
        participants = manager.num_participants()
        if manager.current_step() > before:
            now = manager.current_step()
            print(
                f"step {now} participants {participants} quorum {quorum:.4f} wait {waited:.4f}",
                flush=True,
            )
            count_cpu(now)
    cpu_line(manager.current_step())
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
    waited = work(ddp_model)
    inner.step()
    step += 1
    print(f"step {step} wait {waited:.4f}", flush=True)
    count_cpu(step)
    if ckpt is not None and dist.get_rank() == 0 and step % args.checkpoint_every == 0:
        tmp = ckpt.with_suffix(".tmp")
        torch.save({"model": model.state_dict(), "optim": inner.state_dict(), "step": step}, tmp)
        tmp.replace(ckpt)
cpu_line(step)
dist.destroy_process_group()
