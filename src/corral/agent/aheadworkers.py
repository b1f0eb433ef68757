"""torchrun's workers started ahead: importing torch while torchrun's rendezvous runs.

torchrun starts a node's workers only once its rendezvous is complete (on a c10d
rendezvous the first node to join waits for the others, polling once a second), and
each worker is then a new interpreter that imports torch (1.3-2 CPU-s) before the
script's first line runs. In a launcher held at corral's gate (:mod:`corral.agent.gate`),
:func:`install` starts the node's workers as soon as torchrun has read its arguments
(``torch.distributed.run.config_from_args``): each ``python -u -m corral.agent.gate FD
corral.agent.worker SCRIPT ...``, held at a gate of its own, imports torch (when the
script has an ``import torch`` line, as :func:`corral.agent.gate.preload` decides)
while the rendezvous runs. When torchrun then starts a worker
(``SubprocessHandler._popen``) it is handed one of them, and its gate opens with the
worker's arguments and environment, so the script runs with exactly what torchrun
gave it.

A worker started ahead is handed out only when the command is the one it was started
for (corral's worker, the same interpreter and flags), torchrun redirects none of its
output to files, and its environment differs from the one the worker was started
with only in variables read after the gate (:data:`LATE`: those torchrun sets for
each worker, which torch reads when a process group is made, and corral's own).
Otherwise the workers started ahead are ended (their gates closed: they exit without
running anything) and torchrun starts its own, as without them; the node's log says
why (``corral: workers started ahead not used: ...``). Those torchrun never asks for
(a failed rendezvous, a restart's second round) are ended when it exits.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import subprocess
import sys
from collections.abc import Mapping, Sequence
from typing import Any

from corral.agent.gatenames import LATE_ENV, WORKER, gated_argv, split_argv

__all__ = ["LATE", "Ahead", "install", "unusable"]

#: What torchrun sets for each worker (``LocalElasticAgent._start_workers`` and its
#: error handler): read by torch when the process group is made, or later (with
#: torchrun's ``TORCHELASTIC_*``, see :func:`_late`).
TORCHRUN_WORKER_ENV = frozenset(
    {
        "RANK",
        "LOCAL_RANK",
        "GROUP_RANK",
        "ROLE_RANK",
        "ROLE_NAME",
        "LOCAL_WORLD_SIZE",
        "WORLD_SIZE",
        "GROUP_WORLD_SIZE",
        "ROLE_WORLD_SIZE",
        "MASTER_ADDR",
        "MASTER_PORT",
        "TORCHELASTIC_RESTART_COUNT",
        "TORCHELASTIC_MAX_RESTARTS",
        "TORCHELASTIC_RUN_ID",
        "TORCHELASTIC_USE_AGENT_STORE",
        "TORCHELASTIC_ERROR_FILE",
        "TORCH_NCCL_ASYNC_ERROR_HANDLING",
    }
)
#: The variables a worker started ahead may get only at its gate.
LATE = TORCHRUN_WORKER_ENV | LATE_ENV


class Ahead:
    """A worker started ahead, held at its gate."""

    def __init__(self, popen: subprocess.Popen[bytes], gate: int, head: list[str]) -> None:
        self.popen = popen
        self.gate = gate  # the write end of its gate
        self.head = head  # the command up to the module (interpreter, flags, -m, module)
        self.env = dict(os.environ)  # what it was started with

    def open(self, args: Sequence[str], env: Mapping[str, str]) -> None:
        """Open its gate: run the worker with ``args`` and exactly ``env``."""
        message = {
            "argv": list(args),
            "set": {k: v for k, v in env.items() if self.env.get(k) != v},
            "unset": [k for k in self.env if k not in env],
        }
        try:
            os.write(self.gate, json.dumps(message).encode() + b"\n")
        finally:
            os.close(self.gate)

    def end(self) -> None:
        """Close its gate (it exits without running anything) and reap it."""
        with contextlib.suppress(OSError):
            os.close(self.gate)
        try:
            self.popen.wait(timeout=10)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(OSError):
                os.killpg(self.popen.pid, 9)
            self.popen.wait()


_pool: list[Ahead] = []


def unusable(ahead: Ahead, argv: Sequence[str], env: Mapping[str, str]) -> str | None:
    """Why ``ahead`` cannot be the worker torchrun starts as ``argv`` with ``env``
    (None: it can)."""
    split = split_argv(list(argv))
    if split is None or split[0] != ahead.head:
        return "torchrun runs another command"
    if ahead.popen.poll() is not None:
        return f"one exited ({ahead.popen.returncode})"
    for key in sorted(ahead.env.keys() | env.keys()):
        if ahead.env.get(key) != env.get(key) and not _late(key):
            return f"{key} differs"
    return None


def _late(key: str) -> bool:
    """Whether ``key`` is read only after a worker's gate (see :data:`LATE`): also
    torchrun's own ``TORCHELASTIC_*`` (read by its elastic code in the worker, not by
    ``import torch``) and corral's ``CORRAL_*``."""
    return key in LATE or key.startswith(("TORCHELASTIC_", "CORRAL_"))


def start_ahead(count: int, argv: Sequence[str]) -> int:
    """Start ``count`` workers of torchrun's command ``argv`` held at their gates, with
    this process's environment (torchrun's, its own ``OMP_NUM_THREADS`` included); how
    many (none for a command other than corral's worker)."""
    split = split_argv(list(argv))
    if split is None or split[0][-1] != WORKER:
        return 0
    for _ in range(count):
        gate_r, gate_w = os.pipe()
        try:
            popen = subprocess.Popen(  # as torchrun starts its workers: a session each
                gated_argv(list(argv), gate_r), pass_fds=(gate_r,), start_new_session=True
            )
        except OSError:
            os.close(gate_w)
            break
        finally:
            os.close(gate_r)
        _pool.append(Ahead(popen, gate_w, split[0]))
    return len(_pool)


def take(argv: Sequence[str], env: Mapping[str, str]) -> subprocess.Popen[bytes] | None:
    """A worker started ahead for torchrun's worker ``argv`` with ``env``, its gate
    opened; None when there is none (then all those left are ended: see the module doc)."""
    if not _pool:
        return None
    why = unusable(_pool[0], argv, env)
    if why is not None:
        print(f"corral: workers started ahead not used: {why}", file=sys.stderr, flush=True)
        end_all()
        return None
    ahead = _pool.pop(0)
    split = split_argv(list(argv))
    assert split is not None
    ahead.open(split[1], env)
    return ahead.popen


def end_all() -> None:
    """End every worker started ahead not handed out."""
    while _pool:
        _pool.pop().end()


def install() -> None:
    """Start torchrun's workers ahead in this process (a launcher at its gate opened);
    a torch whose torchrun has not the seams used here runs as it is."""
    try:
        import torch.distributed.run as run
        from torch.distributed.elastic.multiprocessing.subprocess_handler import (
            subprocess_handler as handler,
        )

        read_config = run.config_from_args
        popen = handler.SubprocessHandler._popen
    except (ImportError, AttributeError):
        return

    def config_from_args(args: Any) -> Any:
        config, cmd, cmd_args = read_config(args)
        if isinstance(cmd, str):  # a command, not a function
            with contextlib.suppress(Exception):  # torchrun starts them itself then
                start_ahead(int(config.nproc_per_node), [cmd, *(str(a) for a in cmd_args)])
        return config, cmd, cmd_args

    def _popen(self: Any, args: tuple[str, ...], env: dict[str, str]) -> Any:
        if self._stdout is None and self._stderr is None:
            taken = take(args, env)
            if taken is not None:
                return taken
        end_all()
        return popen(self, args, env)

    run.config_from_args = config_from_args
    handler.SubprocessHandler._popen = _popen  # type: ignore[method-assign]
    atexit.register(end_all)
