"""Start a node's processes before the agent's supervision machinery is loaded.

At the start message the agent makes the node's directory, binds the ranks'
control socket (:class:`~corral.agent.controlsock.ControlSocket`) and starts
the node's workload (the launcher, e.g. torchrun, or one process per rank) with
the standard library alone (:func:`spawn_node`). Only then does it import its
asyncio and psutil machinery (:mod:`corral.agent.node`), which adopts what was
started here. The launcher thus starts importing its framework at once on every
node instead of after the agent's own imports (~30 ms, more on a busy host).

This runs before the agent's signal handlers exist: SIGTERM, SIGINT and SIGHUP
received meanwhile are kept (:attr:`SpawnedNode.signals`) and acted upon once
the agent runs. A failure is kept too (:attr:`SpawnedNode.error`, with whatever
had started), for the agent to report and clean up.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import signal
import subprocess
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from corral.agent.controlsock import ControlSocket
from corral.agent.gatenames import LATE_ENV, gated_argv, split_argv
from corral.agent.protocol import NODE
from corral.agent.warm import Warm, gate_message
from corral.contract import FLIGHT_DIR_ENV, FLIGHT_RECORDER_ENV, NODE_DIR_ENV
from corral.private import append_private, private_dir, write_private
from corral.redact import redacted_node

__all__ = [
    "LATE_ENV",
    "STOP_SIGNALS",
    "SpawnedNode",
    "Workload",
    "flight_recorder_env",
    "record_pgid",
    "spawn_node",
    "warm_unusable",
]

PR_SET_PDEATHSIG = 1
PR_SET_CHILD_SUBREAPER = 36
_LIBC = ctypes.CDLL(None, use_errno=True) if sys.platform.startswith("linux") else None
#: The signals that stop a node (the agent tears it down on each).
STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)


@dataclass
class Workload:
    """A process the agent started directly (a rank, or the launcher)."""

    pid: int
    rank: int  # NODE for the launcher (torchrun)
    popen: subprocess.Popen[bytes]
    local_rank: int = 0
    code: int | None = None
    exit_time: float | None = None
    open_streams: int = 2
    streams_abandoned: bool = False  # exited, but a leftover child still holds its pipes
    drain_scheduled: bool = False
    settled: bool = False
    stderr_tail: list[bytes] = field(default_factory=list)
    warm: bool = False  # a warm launcher the plan adopted (corral.agent.warm)

    @property
    def finished(self) -> bool:
        """Exited, and its output drained (or given up on after the drain window)."""
        return self.code is not None and (self.open_streams == 0 or self.streams_abandoned)


@dataclass
class SpawnedNode:
    """What :func:`spawn_node` made: the node's directory and log, the environment its
    processes got, the control socket, the processes in start order and their process
    groups; the signals received meanwhile and the error that stopped it, if any."""

    node_dir: Path
    env: dict[str, str]
    control: ControlSocket | None = None
    node_log: IO[bytes] | None = None
    workloads: list[Workload] = field(default_factory=list)
    pgids: set[int] = field(default_factory=set)
    signals: list[int] = field(default_factory=list)
    error: Exception | None = None
    gates: dict[int, int] = field(default_factory=dict)  # pid -> its gate's write end
    ready: dict[int, int] = field(default_factory=dict)  # pid -> read end: its imports done
    created_dir: bool = False  # the node's directory did not exist before
    cwd: str = ""  # the processes' working directory


def set_subreaper() -> None:
    """Adopt orphaned descendants (Linux), so teardown can always find them."""
    if _LIBC is not None:
        _LIBC.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)


def child_setup(group: int) -> Callable[[], None]:
    """What a workload process does between fork and exec: join the node's process
    group and die with the agent (so a SIGKILLed agent leaves nothing behind)."""

    def setup() -> None:
        os.setpgid(0, group)
        if _LIBC is not None:
            _LIBC.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)

    return setup


def flight_recorder_env(
    node_dir: Path, env: Mapping[str, str], argv: Sequence[str] | None = None
) -> dict[str, str]:
    """The variables that turn on PyTorch's flight recorder for a node's ranks, unless
    ``CORRAL_FLIGHT_RECORDER=0``; creates ``<node_dir>/flight/`` (0700) for the dumps.

    When the node's ``argv`` runs corral's rank wrapper (None: it does): the folder
    alone, from which the wrapper sets the names its torch reads
    (:mod:`corral.agent.flight`); else (``--launcher command``) those names too, for
    the torch of this interpreter.
    Variables the user set are kept."""
    from corral.agent.flight import FOLDER, WRAPPER, installed_torch_version, torch_env

    if env.get(FLIGHT_RECORDER_ENV, "") == "0":
        return {}
    folder = Path(node_dir) / FOLDER
    try:
        private_dir(folder)
    except OSError:
        return {}
    values = {FLIGHT_DIR_ENV: str(folder)}
    if argv is not None and WRAPPER not in argv:
        values.update(torch_env(folder, env, installed_torch_version()))
    return values


def record_pgid(pgids: set[int], node_dir: Path, pid: int) -> None:
    """Add the process group of ``pid`` to ``pgids`` (not the agent's own) and keep the
    set in ``<node_dir>/pgids``, where the coordinator's cleanup finds it."""
    try:
        pgid = os.getpgid(pid)
    except OSError:
        return
    if pgid in pgids or pgid == os.getpgrp():
        return
    pgids.add(pgid)
    with contextlib.suppress(OSError):
        write_private(node_dir / "pgids", "".join(f"{g}\n" for g in sorted(pgids)))


def node_dir_of(node: Mapping[str, Any]) -> Path:
    """Where a node's directory is (its ``CORRAL_NODE_DIR``, absolute)."""
    return Path(os.path.expanduser(node["env"].get(NODE_DIR_ENV, ".corral-node"))).absolute()


def keep_signals(spawned: SpawnedNode) -> None:
    """Keep the stop signals received from now on, for the agent to act upon."""
    for signum in STOP_SIGNALS:
        signal.signal(signum, lambda received, _frame: spawned.signals.append(received))


def spawn_node(
    node: Mapping[str, Any], *, gated: bool = False, warm: Warm | None = None
) -> SpawnedNode:
    """Make the node's directory, bind the control socket and start the node's
    processes (the start message's ``node``); never raises (see the module doc).
    ``gated``: each process is held at its gate (:mod:`corral.agent.prestart`), and
    stop signals keep their default action (the processes die with the agent).
    ``warm``: a launcher started before the plan was known, adopted when it can run
    the node's (:func:`warm_unusable`; its gate opened at once unless ``gated``),
    else discarded."""
    env = dict(node["env"])
    node_dir = node_dir_of(node)
    env[NODE_DIR_ENV] = str(node_dir)
    spawned = SpawnedNode(node_dir=node_dir, env=env, created_dir=not node_dir.exists())
    if not gated:
        keep_signals(spawned)
    set_subreaper()
    try:
        env.update(flight_recorder_env(node_dir, env, node["argv"]))
        cwd = spawned.cwd = _prepare(spawned, node)
        spawned.control = ControlSocket(str(node_dir))
        env.update(spawned.control.env())
        if warm is not None and _adopted(spawned, node, warm, gated):
            return spawned
        _start(spawned, node, cwd, gated)
    except Exception as exc:
        spawned.error = exc
    finally:
        if warm is not None:
            warm.discard()  # not adopted: killed (a no-op once adopted)
    return spawned


def warm_unusable(warm: Warm, argv: Sequence[str], env: Mapping[str, str]) -> str | None:
    """Why ``warm`` cannot be the launcher of a node that runs ``argv`` with the whole
    environment ``env`` (None: it can): another command (interpreter, flags, module,
    per-rank processes), an exit, or a variable other than :data:`LATE_ENV` and
    corral's own that differs from the one it was started with."""
    split = split_argv(list(argv))
    if split is None or split[0] != warm.head:
        return "the node runs another command"
    if warm.popen.poll() is not None:
        return f"it exited ({warm.popen.returncode})"
    for key in sorted(warm.env.keys() | env.keys()):
        late = key in LATE_ENV or key.startswith("CORRAL_")
        if warm.env.get(key) != env.get(key) and not late:
            return f"{key} differs"
    return None


def _adopted(spawned: SpawnedNode, node: Mapping[str, Any], warm: Warm, gated: bool) -> bool:
    """Whether the warm launcher became the node's (see :func:`spawn_node`); why not is
    written to the node's log."""
    env = {**os.environ, **spawned.env}
    why = "the node starts a process per rank" if node.get("ranks") else None
    why = why or warm_unusable(warm, node["argv"], env)
    if why is not None:
        if spawned.node_log is not None:
            spawned.node_log.write(f"corral agent: warm launcher not used: {why}\n".encode())
        return False
    warm.adopt()
    pid = warm.popen.pid
    spawned.workloads.append(Workload(pid=pid, rank=NODE, popen=warm.popen, warm=True))
    record_pgid(spawned.pgids, spawned.node_dir, pid)
    if gated:
        spawned.gates[pid], spawned.ready[pid] = warm.gate, warm.ready
        return True
    args = split_argv(list(node["argv"]))
    assert args is not None
    with contextlib.suppress(OSError):  # it died meanwhile: reported as its exit
        os.write(warm.gate, gate_message(args[1], env, spawned.cwd))
    for fd in (warm.gate, warm.ready):
        os.close(fd)
    return True


def _prepare(spawned: SpawnedNode, node: Mapping[str, Any]) -> str:
    """The node's private directories, log, pid and (redacted) spec; its working dir."""
    node_dir = spawned.node_dir
    private_dir(node_dir)
    for sub in ("logs", "errors"):
        private_dir(node_dir / sub)
    spawned.node_log = append_private(node_dir / "logs" / "node.log")
    write_private(node_dir / "agent.pid", f"{os.getpid()}\n")
    write_private(node_dir / "spec.json", json.dumps(redacted_node(node), indent=1))
    cwd = os.path.abspath(os.path.expanduser(str(node["cwd"])))
    if not os.path.isdir(cwd):
        if not cwd.startswith(str(node_dir) + os.sep):
            raise FileNotFoundError(f"working directory {cwd} does not exist")
        os.makedirs(cwd, exist_ok=True)
    return cwd


def _start(spawned: SpawnedNode, node: Mapping[str, Any], cwd: str, gated: bool) -> None:
    """One process per rank spec (all in the first one's group), or the one launcher."""
    argv = list(node["argv"])
    rank_specs = node.get("ranks") or []
    if not rank_specs:
        spawned.workloads.append(_popen(spawned, argv, dict(spawned.env), cwd, 0, NODE, gated))
        return
    group = 0
    for spec in rank_specs:
        env = {**spawned.env, **spec["env"]}
        work = _popen(spawned, argv, env, cwd, group, int(spec["rank"]), gated)
        work.local_rank = int(spec["local_rank"])
        group = group or work.pid
        spawned.workloads.append(work)


def _popen(
    spawned: SpawnedNode,
    argv: list[str],
    env: dict[str, str],
    cwd: str,
    group: int,
    rank: int,
    gated: bool = False,
) -> Workload:
    child_ends: tuple[int, ...] = ()
    if gated:  # the process reads its gate's end and writes "ready" on the other pipe
        gate_r, gate_w = os.pipe()
        ready_r, ready_w = os.pipe()
        child_ends = (gate_r, ready_w)
        argv = gated_argv(argv, gate_r, ready_w)
    try:
        popen = subprocess.Popen(
            argv,
            env={**os.environ, **env},
            cwd=cwd,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            preexec_fn=child_setup(group),
            pass_fds=child_ends,
        )
    except BaseException:
        if gated:
            os.close(gate_w)
            os.close(ready_r)
        raise
    finally:
        for end in child_ends:
            os.close(end)
    if gated:
        spawned.gates[popen.pid] = gate_w
        spawned.ready[popen.pid] = ready_r
    record_pgid(spawned.pgids, spawned.node_dir, popen.pid)
    return Workload(pid=popen.pid, rank=rank, popen=popen)
