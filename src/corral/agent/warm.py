"""A node's launcher started before its plan is known: a *warm* launcher.

When a head start (:mod:`corral.job.headstart`) already knows that the job's
launcher is torchrun when it starts a node's agent (the ``corral`` entry point
read ``--launcher`` from the command line before the CLI loaded), the agent gets
``--warm torch.distributed.run`` (:func:`agent_argv`). Its first act (:func:`start`)
is to start ``python -m corral.agent.gate --warm PID FD,READY torch.distributed.run``
with its own interpreter and environment: torchrun imports torch while the
coordinator still loads its CLI, validates the options and plans the job, where
without it the node's launcher starts only once the agent has the plan.

The node's plan (the ``prestart`` op, the probe's, or the start message) adopts it
as its launcher, held at its gate (:func:`corral.agent.spawn.spawn_node`), when it
can run it (:func:`corral.agent.spawn.warm_unusable`): the same interpreter and
module with no flags, one launcher for the node (not per-rank processes), and an
environment that differs from the one the plan gives its launcher only in variables
read after the gate (:data:`corral.agent.spawn.LATE_ENV`, corral's own
``CORRAL_*``). Another variable (``PYTHONPATH``, an ``--env`` of the user's,
``LD_*``...) may have changed what was imported before the gate: such a plan
discards the warm launcher and starts its own, as without one.

The warm process imports torch with no working directory on ``sys.path`` (the
agent's is not the plan's); its gate's message (:func:`gate_message`) carries the
launcher's whole environment (``os.environ`` replaced), its working directory
(``chdir``, and first on ``sys.path`` as ``python -m`` puts it) and its arguments,
applied before torchrun's main runs: torchrun and the workers it starts see exactly
the plan's environment, directory and command.

A warm launcher nobody adopts (a plan it cannot run, an abort, the agent's end) is
discarded (:meth:`Warm.discard`): its gate closed, its process group killed and
waited for. It dies with the agent too (it sets ``PR_SET_PDEATHSIG`` itself, and
exits at its gate's end of file).
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from collections.abc import Mapping, Sequence

from corral.agent.gatenames import GATE_MODULE, TORCHRUN, WARM_FLAG

__all__ = [
    "WARM_MODULES",
    "Warm",
    "agent_argv",
    "gate_message",
    "reap",
    "requested",
    "start",
]

#: The modules a warm launcher can run (the node's launcher before the plan is known).
WARM_MODULES = (TORCHRUN,)


def agent_argv(argv: Sequence[str], module: str | None) -> list[str]:
    """The node agent's command ``argv`` asking for a warm ``module`` (None: as it is)."""
    if module is None:
        return list(argv)
    if module not in WARM_MODULES:
        raise ValueError(f"no warm launcher for {module}")
    return [*argv, WARM_FLAG, module]


def requested(argv: Sequence[str]) -> str | None:
    """The warm module the agent's arguments ask for (``--warm MODULE``), if any."""
    words = list(argv)
    if WARM_FLAG in words[:-1]:
        module = words[words.index(WARM_FLAG) + 1]
        return module if module in WARM_MODULES else None
    return None


class Warm:
    """A launcher started by :func:`start`, held at its gate until a plan adopts it."""

    def __init__(self, popen: subprocess.Popen[bytes], module: str, gate: int, ready: int) -> None:
        self.popen = popen
        self.module = module
        self.gate = gate  # the write end of its gate
        self.ready = ready  # the read end its "ready" line comes on
        self.env = dict(os.environ)  # the environment it was started with
        self.settled = False  # adopted by a plan, or discarded

    @property
    def head(self) -> list[str]:
        """The command a plan must run for this launcher to run it."""
        return [sys.executable, "-m", self.module]

    def adopt(self) -> None:
        """The plan's node takes the process, its gate and its ready pipe."""
        self.settled = True

    def discard(self) -> None:
        """Close its gate, kill its process group and wait for it (no-op once settled)."""
        if self.settled:
            return
        self.settled = True
        for fd in (self.gate, self.ready):
            with contextlib.suppress(OSError):
                os.close(fd)
        with contextlib.suppress(OSError):
            os.killpg(self.popen.pid, signal.SIGKILL)
        reap(self.popen)


def reap(popen: subprocess.Popen[bytes]) -> None:
    """Kill ``popen``, wait for it (at most 10 s) and close its output pipes."""
    with contextlib.suppress(OSError, subprocess.TimeoutExpired):
        popen.kill()
        popen.wait(timeout=10)
    for stream in (popen.stdout, popen.stderr):
        if stream is not None:
            stream.close()


def start(module: str) -> Warm | None:
    """Start ``module`` warm, at its gate (None when this interpreter cannot: before
    Python 3.11, or the start failed; the plan's processes are started then)."""
    if sys.version_info < (3, 11) or not sys.executable or module not in WARM_MODULES:
        return None
    gate_r, gate_w = os.pipe()
    ready_r, ready_w = os.pipe()
    argv = [sys.executable, "-m", GATE_MODULE, WARM_FLAG, str(os.getpid())]
    try:
        popen = subprocess.Popen(
            [*argv, f"{gate_r},{ready_w}", module],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            pass_fds=(gate_r, ready_w),
            process_group=0,  # its own group, as a node's launcher gets
        )
    except OSError:
        os.close(gate_w)
        os.close(ready_r)
        return None
    finally:
        os.close(gate_r)
        os.close(ready_w)
    return Warm(popen, module, gate_w, ready_r)


def gate_message(args: Sequence[str], env: Mapping[str, str], cwd: str) -> bytes:
    """What opens a warm launcher's gate: its arguments, whole environment and directory."""
    import json

    message = {"argv": list(args), "env": dict(env), "cwd": cwd}
    return json.dumps(message).encode() + b"\n"
