"""A node's processes started while the pre-flight checklist runs, released when it passed.

The coordinator sends the plan of the node with the probe (or in a ``prestart``
op after it) while the checklist still runs. When its command is the torchrun
launcher or corral's per-rank worker, the agent starts the node's processes at
once through the gate (:mod:`corral.agent.gate`): their interpreters start and
import torch meanwhile, but nothing of the job runs. Then:

* the start message (the checklist passed) opens the gates (:func:`release`):
  each process gets the start message's arguments and environment and runs it.
  Only what a process reads after its gate may differ from the plan it was
  started with (its rank numbers, the rendezvous address and port, the
  interfaces the checks found, corral's own variables): for anything else (its
  interpreter, directory or another variable) the processes are killed and the
  node is started from the start message, as without a head start;
* an ``abort`` (the checklist failed, the launch was called off) or the
  coordinator's end closes the gates (:func:`cancel`): each process exits
  without running anything of the job, the node's process groups are killed, and
  the node's directory, when this made it, is removed.

Signals keep their default action until the gates open: a killed agent takes its
held processes with it (``PR_SET_PDEATHSIG``).

After the start message the agent waits for the released processes' imports
(:func:`wait_preloaded`) before it loads its own machinery and reports: on a host
with few cores that work (and the coordinator's, which follows the agent's first
event) would otherwise share the CPUs with the launcher's import of torch, the
path to the first rendezvous join, and come out of the time to the first step.
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import shutil
import signal
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from corral.agent.gate import split_argv
from corral.agent.protocol import decode_op
from corral.agent.spawn import LATE_ENV, SpawnedNode, keep_signals, node_dir_of, spawn_node
from corral.agent.warm import Warm, gate_message, reap
from corral.contract import FLIGHT_RECORDER_ENV, NODE_DIR_ENV
from corral.private import write_private
from corral.redact import redacted_node

__all__ = [
    "LATE_ENV",
    "Prestarted",
    "cancel",
    "mismatch",
    "prestart",
    "release",
    "wait_preloaded",
]

# LATE_ENV: the variables the held processes read only after their gate, which may
# differ between the two plans; corral's own ``CORRAL_*`` variables too, but these:
_EARLY_CORRAL = frozenset({NODE_DIR_ENV, FLIGHT_RECORDER_ENV})  # read by the agent at spawn


@dataclass
class Prestarted:
    """The processes started for ``node`` (the plan sent while the checks ran)."""

    node: Mapping[str, Any]
    spawned: SpawnedNode


def prestart(
    node: Mapping[str, Any], held: Prestarted | None = None, warm: Warm | None = None
) -> Prestarted | None:
    """Start ``node``'s processes held at their gates; None when its command cannot be
    held (another launcher) or they could not be started (the start message tries
    again and reports why). ``held``: those started for an earlier plan of the node,
    kept when they can run this one, else replaced. ``warm``: the node's launcher
    started before any plan (:mod:`corral.agent.warm`), adopted when it can run this
    one, else discarded."""
    gated = split_argv(node["argv"]) is not None
    if warm is not None and (held is not None or not gated):
        warm.discard()
    created = None
    if held is not None:
        if mismatch(held.node, node) is None:
            return held
        created = held.spawned.created_dir
        cancel(held, remove_dir=not gated)
    if not gated:
        return None
    spawned = spawn_node(node, gated=True, warm=warm)
    if created is not None:
        spawned.created_dir = created  # removed on an abort if the first plan made it
    fresh = Prestarted(node, spawned)
    if spawned.error is not None:
        cancel(fresh)
        return None
    return fresh


def _local_ranks(node: Mapping[str, Any]) -> list[int]:
    return sorted(int(r["local_rank"]) for r in node.get("ranks") or [])


def mismatch(old: Mapping[str, Any], new: Mapping[str, Any]) -> str | None:
    """Why processes started for the plan ``old`` cannot run the plan ``new`` (None:
    they can; only :data:`LATE_ENV`, corral's own variables and the module's
    arguments differ)."""
    if node_dir_of(old) != node_dir_of(new):
        return "its node directory changed"
    if old["cwd"] != new["cwd"]:
        return "its working directory changed"
    before, after = split_argv(old["argv"]), split_argv(new["argv"])
    if before is None or after is None or before[0] != after[0]:
        return "its command changed"
    if _local_ranks(old) != _local_ranks(new):
        return "its ranks changed"
    for old_env, new_env in zip(_envs(old), _envs(new), strict=True):
        for key in sorted(old_env.keys() | new_env.keys()):
            if old_env.get(key) == new_env.get(key) or key in LATE_ENV:
                continue
            if key.startswith("CORRAL_") and key not in _EARLY_CORRAL:
                continue
            return f"{key} changed"
    return None


def _envs(node: Mapping[str, Any]) -> list[dict[str, str]]:
    """Each process's planned variables, by local rank (the launcher's alone)."""
    ranks = sorted(node.get("ranks") or [], key=lambda r: int(r["local_rank"]))
    if not ranks:
        return [dict(node["env"])]
    return [{**node["env"], **r["env"]} for r in ranks]


def _gate_message(
    old: Mapping[str, str], new: Mapping[str, str], argv: list[str]
) -> dict[str, Any]:
    """The variables to set and remove so that a process started with ``old`` has
    ``new`` (what the agent's own environment gives it where ``new`` has nothing)."""
    changed = {k: v for k, v in new.items() if old.get(k) != v}
    unset = []
    for key in old:
        if key not in new:
            if key in os.environ:
                changed[key] = os.environ[key]
            else:
                unset.append(key)
    return {"argv": argv, "set": changed, "unset": unset}


def release(held: Prestarted, node: Mapping[str, Any]) -> tuple[SpawnedNode, str | None]:
    """Run the start message's ``node``: open the held processes' gates when they can
    run it, else kill them and start it anew. The node and why it was started anew."""
    spawned = held.spawned
    why = mismatch(held.node, node)
    if why is None and any(w.popen.poll() is not None for w in spawned.workloads):
        why = "a held process exited"
    if why is not None:
        cancel(held, remove_dir=False)
        return spawn_node(node), why
    keep_signals(spawned)
    split = split_argv(node["argv"])
    assert split is not None
    old_env, new_env = dict(held.node["env"]), dict(node["env"])
    common = _gate_message(old_env, new_env, [])
    spawned.env.update(common["set"])
    for key in common["unset"]:
        spawned.env.pop(key, None)
    ranks = {int(r["local_rank"]): r for r in node.get("ranks") or []}
    old_ranks = {int(r["local_rank"]): r for r in held.node.get("ranks") or []}
    for work in spawned.workloads:
        before, after = old_env, new_env
        if ranks:
            before = {**old_env, **old_ranks[work.local_rank]["env"]}
            after = {**new_env, **ranks[work.local_rank]["env"]}
            work.rank = int(ranks[work.local_rank]["rank"])
        if work.warm:  # started before any plan: the whole environment, and where
            message = gate_message(split[1], {**os.environ, **spawned.env}, spawned.cwd)
        else:
            message = json.dumps(_gate_message(before, after, split[1])).encode() + b"\n"
        fd = spawned.gates.pop(work.pid)
        with contextlib.suppress(OSError):  # it died meanwhile: reported as its exit
            os.write(fd, message)
        os.close(fd)
    with contextlib.suppress(OSError):
        write_private(spawned.node_dir / "spec.json", json.dumps(redacted_node(node), indent=1))
    return spawned, None


def _only_heartbeats(pending: bytes) -> bool:
    """Whether every complete line of ``pending`` is a coordinator heartbeat."""
    for line in pending.splitlines(keepends=True):
        if not line.endswith(b"\n"):
            break
        try:
            if decode_op(line).get("op") != "hb":
                return False
        except ValueError:
            return False
    return True


def wait_preloaded(
    spawned: SpawnedNode, stdin_fd: int, limit: float, pending: bytes = b""
) -> bytes:
    """Wait until every released process has finished its imports (its ``ready``
    line, or its exit), for at most ``limit`` seconds (one heartbeat interval: the
    coordinator hears from the agent that late at worst). A coordinator op other than
    a heartbeat (stop, kill...), its disconnection or a stop signal ends the wait at
    once. Returns ``pending`` (what was read from ``stdin_fd`` before: it ends the wait
    as well when it holds such an op) with what was read meanwhile, for the agent's
    reader."""
    deadline = time.monotonic() + limit
    try:
        while spawned.ready and not spawned.signals and _only_heartbeats(pending):
            left = deadline - time.monotonic()
            if left <= 0:
                break
            # short slices: a stop signal only sets spawned.signals (select resumes)
            fds = [*spawned.ready.values(), stdin_fd]
            readable, _, _ = select.select(fds, [], [], min(left, 0.2))
            if stdin_fd in readable:
                chunk = os.read(stdin_fd, 65536)
                pending += chunk
                if not chunk or not _only_heartbeats(pending):
                    break
            for pid, fd in list(spawned.ready.items()):
                if fd in readable:
                    with contextlib.suppress(OSError):
                        os.read(fd, 64)  # "ready", or EOF: it exited
                    os.close(spawned.ready.pop(pid))
    finally:
        _close_ready(spawned)
    return pending


def _close_ready(spawned: SpawnedNode) -> None:
    for fd in spawned.ready.values():
        with contextlib.suppress(OSError):
            os.close(fd)
    spawned.ready.clear()


def cancel(held: Prestarted, *, remove_dir: bool = True) -> None:
    """Close the gates, kill the held processes' groups and wait for them; remove the
    node's directory when the prestart made it (``remove_dir``)."""
    spawned = held.spawned
    for fd in spawned.gates.values():
        with contextlib.suppress(OSError):
            os.close(fd)
    spawned.gates.clear()
    _close_ready(spawned)
    for pgid in spawned.pgids:
        with contextlib.suppress(OSError):
            os.killpg(pgid, signal.SIGKILL)
    for work in spawned.workloads:
        reap(work.popen)
    if spawned.control is not None:
        spawned.control.close()
    if spawned.node_log is not None:
        spawned.node_log.close()
    if remove_dir and spawned.created_dir:
        shutil.rmtree(spawned.node_dir, ignore_errors=True)
