"""Test job for ``--recovery in-place``: one torchft replica group per node, trained
over gloo on CPU, using torchft directly (Manager, DDP, Optimizer).

Every step it prints ``group G step S participants P`` and reports the step to corral;
``--kill-group G --kill-at S`` SIGKILLs that group's rank once, at step S or later
and after a step with every group (so the others have trained with all of them
before it goes, however late it joined; a marker file in the node's working
directory keeps its restart alive);
``--hang-group G --hang-at S`` makes that group's rank sleep forever once, the same
way (corral's hang detection must tear down that group only). Second failures:
``--kill-healing`` SIGKILLs the restarted kill group once more while it heals (in
its ``load_state_dict``); ``--kill-while-away G`` SIGKILLs group G once when, after a
step with every group, it trains with fewer (another group is away). Every group
trains until step N (``--steps``) *and* a step with every configured group in the
quorum: the survivors keep going until the lost group is back, so the test never depends on timing.
Under torchrun or corral's ``--launcher python`` (which imports torch once less per group).
``--kill-lighthouse-at S``: group 0 SIGKILLs this job's Lighthouse (the coordinator's
child marked with the job's CORRAL_JOB_ID, on this machine) once, at step S or later
after a step with every group. ``--corral-quorum-ids``: the process group and the
Manager's quorum ids as ``sdk.fault_tolerant`` makes them (:mod:`corral.sdk._ftids`:
unique across Lighthouse restarts); without it, torchft's own.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
import time
from datetime import timedelta
from pathlib import Path

import torch
from torch import nn
from torchft import DistributedDataParallel, Manager, Optimizer, ProcessGroupGloo

from corral.sdk import report

parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=40)
parser.add_argument("--kill-group", type=int, default=-1)
parser.add_argument("--kill-at", type=int, default=10)
parser.add_argument("--kill-healing", action="store_true")
parser.add_argument("--kill-while-away", type=int, default=-1)
parser.add_argument("--hang-group", type=int, default=-1)
parser.add_argument("--hang-at", type=int, default=10)
parser.add_argument("--sleep", type=float, default=0.05)
parser.add_argument("--kill-lighthouse-at", type=int, default=-1)
parser.add_argument("--corral-quorum-ids", action="store_true")
args = parser.parse_args()

logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(message)s")
for name in ("torchft.manager",):
    logging.getLogger(name).setLevel(logging.INFO)

group = int(os.environ["CORRAL_REPLICA_GROUP"])
groups = int(os.environ["CORRAL_REPLICA_GROUPS"])
torch.manual_seed(0)
model = nn.Linear(8, 1)
inner = torch.optim.SGD(model.parameters(), lr=0.01)


def hang_forever() -> None:
    """Stuck outside any collective (what the stack dump shows)."""
    while True:
        time.sleep(3600)


def state_dict() -> dict[str, object]:
    return {"model": model.state_dict(), "optim": inner.state_dict()}


def die_once(marker: str, why: str) -> None:
    """SIGKILL this rank unless ``marker`` (in the node's working dir) exists."""
    if Path(marker).exists():
        return
    Path(marker).write_text("1")
    print(f"group {group} is about to be killed {why}", file=sys.stderr, flush=True)
    os.kill(os.getpid(), signal.SIGKILL)


def kill_lighthouse() -> None:
    """SIGKILL this job's Lighthouse (local nodes: it runs on this machine)."""
    job = os.environ["CORRAL_JOB_ID"].encode()
    for entry in Path("/proc").iterdir():
        try:
            cmdline = (entry / "cmdline").read_bytes()
            environ = (entry / "environ").read_bytes()
        except OSError:
            continue
        if b"corral.recovery.lighthouse" in cmdline and b"CORRAL_JOB_ID=" + job in environ:
            argv = cmdline.decode().split("\0")
            join = argv[argv.index("--join-timeout-ms") + 1]
            print(f"group {group} kills the Lighthouse (join timeout {join} ms)", flush=True)
            print(f"group {group} kills the Lighthouse", file=sys.stderr, flush=True)
            os.kill(int(entry.name), signal.SIGKILL)


def load_state_dict(sd: dict[str, object]) -> None:
    if args.kill_healing and group == args.kill_group and Path("killed-once").exists():
        die_once("killed-healing", "while healing")
    model.load_state_dict(sd["model"])  # type: ignore[arg-type]
    inner.load_state_dict(sd["optim"])  # type: ignore[arg-type]


store_addr, store_port = None, None  # torchrun's: its agent serves MASTER_PORT
if "TORCHELASTIC_RUN_ID" not in os.environ:
    # corral's --launcher python: nobody serves MASTER_PORT, the group (one rank) hosts
    # its own store, as sdk.fault_tolerant does
    store = torch.distributed.TCPStore("127.0.0.1", 0, 1, True, wait_for_workers=False)
    store_addr, store_port = "127.0.0.1", int(store.port)
pg_class = ProcessGroupGloo
if args.corral_quorum_ids:
    from corral.sdk._ftids import reconfigurable, unique_quorum_ids

    pg_class = reconfigurable(ProcessGroupGloo)
manager = Manager(
    pg=pg_class(timeout=timedelta(seconds=10)),
    store_addr=store_addr,
    store_port=store_port,
    min_replica_size=int(os.environ.get("CORRAL_MIN_REPLICAS", "1")),
    load_state_dict=load_state_dict,
    state_dict=state_dict,
    replica_id=f"corral_{group}",
    timeout=timedelta(seconds=10),
    quorum_timeout=timedelta(seconds=60),
    hostname=os.environ["MASTER_ADDR"],  # the group's host, as the other groups reach it
)
if args.corral_quorum_ids:
    assert unique_quorum_ids(manager)
ddp = DistributedDataParallel(manager, model)
optimizer = Optimizer(manager, inner)
data = torch.randn(64, 8)
target = data.sum(dim=1, keepdim=True)
participants = 0
everyone = False  # a step with every group seen
while manager.current_step() < args.steps or participants < groups:
    step = manager.current_step()
    optimizer.zero_grad()
    loss = nn.functional.mse_loss(ddp(data), target)
    loss.backward()
    optimizer.step()
    participants = manager.num_participants()
    done = manager.current_step()
    if done > step:  # committed (a healed group jumps to the quorum's step)
        print(f"group {group} step {done} participants {participants}", flush=True)
        report(step=done, total=args.steps, loss=float(loss), participants=participants)
    everyone = everyone or participants == groups
    if group == args.kill_while_away and everyone and participants < groups:
        die_once("killed-away", "while another group is away")
    marker = Path("killed-once")  # the node's own working dir: a restarted group skips it
    if group == args.kill_group and step >= args.kill_at and everyone and not marker.exists():
        marker.write_text("1")
        print(f"group {group} is about to be killed", file=sys.stderr, flush=True)
        os.kill(os.getpid(), signal.SIGKILL)
    killed_lh = Path("lighthouse-killed")
    if group == 0 and 0 <= args.kill_lighthouse_at <= step and everyone and not killed_lh.exists():
        killed_lh.write_text("1")
        kill_lighthouse()
    hung = Path("hung-once")
    if group == args.hang_group and step >= args.hang_at and not hung.exists():
        hung.write_text("1")
        print(f"group {group} is about to hang", file=sys.stderr, flush=True)
        hang_forever()
    time.sleep(args.sleep)
print(f"group {group} done at step {manager.current_step()}", flush=True)
manager.shutdown(wait=False)
