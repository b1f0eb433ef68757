"""``python -m corral.agent.gate FD[,READY] MODULE [ARGS...]``: a node's launcher or
rank, started while the pre-flight checklist still runs, held at a gate.

The agent starts the node's processes through this wrapper as soon as it knows
the plan (the ``prestart`` op, :mod:`corral.agent.prestart`): the interpreter
starts and the framework is imported (torch for ``torch.distributed.run``, or for
a rank whose script imports it) while the checks run. Then it blocks reading the
gate, the pipe on ``FD`` that only the agent writes:

* one JSON line ``{"argv": [...], "set": {...}, "unset": [...]}``: the checklist
  passed. The environment is brought to the start message's (variables set and
  removed) and ``MODULE``'s main runs with its arguments (what ``python -m MODULE
  ARGS`` runs), in this process, with what it imported. A warm launcher's line
  (``python -m corral.agent.gate --warm PID FD,READY MODULE``, started by the agent
  ``PID`` before it had a plan, :mod:`corral.agent.warm`) is ``{"argv": [...],
  "env": {...}, "cwd": DIR}``: the whole environment, and the directory it changes to
  and puts first on ``sys.path`` (it imported torch with none there);
* end of file without a line: the launch was called off. It exits at once; no
  code of the job ran (the agent kills the node's process group anyway).

Nothing of the user's is imported before the gate opens: only torch itself (and
corral's worker), never a module of the script's own.
"""

from __future__ import annotations

import contextlib
import importlib
import json
import os
import re
import sys
from typing import Any

from corral.agent.gatenames import (
    GATE_MODULE,
    GATED_MODULES,
    TORCHRUN,
    WARM_FLAG,
    WORKER,
    gated_argv,
    split_argv,
)

__all__ = [
    "GATED_MODULES",
    "GATE_MODULE",
    "TORCHRUN",
    "WARM_FLAG",
    "WORKER",
    "gated_argv",
    "split_argv",
]
_IMPORTS_TORCH = re.compile(rb"^[ \t]*(?:import[ \t]+torch\b|from[ \t]+torch\b)", re.MULTILINE)
_MAX_SCRIPT = 4 << 20  # bytes of a script scanned for its torch import


def imports_torch(script: str) -> bool:
    """Whether ``script``'s source has an ``import torch`` / ``from torch...`` line."""
    try:
        with open(script, "rb") as fh:
            return _IMPORTS_TORCH.search(fh.read(_MAX_SCRIPT)) is not None
    except OSError:
        return False


def preload(module: str, args: list[str]) -> list[str]:
    """Import what ``module`` (run with ``args``) imports first: torch for torchrun, and
    for a rank whose script imports torch. Returns what was imported; a module that
    cannot be imported is left for the run itself to report."""
    wanted = [TORCHRUN] if module == TORCHRUN else [WORKER]
    if module == WORKER and args and imports_torch(args[0]):
        wanted.append("torch")
    done = []
    for name in wanted:
        with contextlib.suppress(Exception):
            importlib.import_module(name)
            done.append(name)
    return done


def tell_ready(fd: int | None) -> None:
    """Tell the agent that the imports are done (a line on ``fd``, then closed)."""
    if fd is None:
        return
    with contextlib.suppress(OSError):
        os.write(fd, b"ready\n")
    with contextlib.suppress(OSError):
        os.close(fd)


def read_gate(fd: int) -> dict[str, Any] | None:
    """Block until the agent opens the gate (its message) or calls the launch off (None)."""
    data = b""
    while not data.endswith(b"\n"):
        try:
            chunk = os.read(fd, 65536)
        except InterruptedError:
            continue
        if not chunk:
            return None
        data += chunk
    os.close(fd)
    message = json.loads(data)
    return message if isinstance(message, dict) else None


def apply_gate(message: dict[str, Any]) -> list[str]:
    """Set the environment the start message planned (a warm launcher's: all of it,
    and its directory); the module's arguments."""
    env = message.get("env")
    if isinstance(env, dict):
        os.environ.clear()
        os.environ.update({str(k): str(v) for k, v in env.items()})
    if message.get("cwd"):
        os.chdir(str(message["cwd"]))
    for key in message.get("unset") or []:
        os.environ.pop(str(key), None)
    os.environ.update({str(k): str(v) for k, v in (message.get("set") or {}).items()})
    return [str(a) for a in message.get("argv") or []]


def _held_warm(parent: int) -> bool:
    """A warm launcher (see the module doc) at its start: it dies with the agent
    ``parent`` (exits at once when that is gone already) and drops the agent's
    working directory from ``sys.path``. Whether it was there."""
    if sys.platform.startswith("linux"):
        import ctypes
        import signal

        with contextlib.suppress(OSError, AttributeError):
            ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL, 0, 0, 0)  # PDEATHSIG
    if os.getppid() != parent:
        os._exit(0)
    if not getattr(sys.flags, "safe_path", False) and sys.path and sys.path[0] == os.getcwd():
        sys.path.pop(0)
        return True
    return False


def main(argv: list[str]) -> int:
    """Preload, wait at the gate, run ``MODULE`` as ``__main__`` (see the module doc)."""
    warm = argv[:1] == [WARM_FLAG] and len(argv) > 1 and argv[1].isdigit()
    path_dropped = _held_warm(int(argv[1])) if warm else False
    argv = argv[2:] if warm else argv
    if len(argv) < 2 or argv[1] not in GATED_MODULES:
        usage = f"[{WARM_FLAG} PID] FD[,READY] {{{','.join(GATED_MODULES)}}} [ARGS...]"
        print(f"usage: python -m corral.agent.gate {usage}")
        return 2
    fds, module = [int(f) for f in argv[0].split(",")], argv[1]
    fd, ready = fds[0], (fds[1] if len(fds) > 1 else None)
    preload(module, argv[2:])
    tell_ready(ready)
    message = read_gate(fd)
    if message is None:
        os._exit(0)  # called off: nothing ran, nothing to flush (skip torch's destructors)
    args = apply_gate(message)
    if path_dropped:
        sys.path.insert(0, os.getcwd())  # where ``python -m`` puts its directory
    if module == WORKER:
        from corral.agent.worker import main as run_worker

        return run_worker(args)
    from torch.distributed.run import __file__ as torchrun_file
    from torch.distributed.run import main as run_torchrun

    from corral.agent.aheadworkers import install

    install()  # its workers import torch while its rendezvous runs
    sys.argv = [torchrun_file or module, *args]
    run_torchrun()  # what ``python -m torch.distributed.run ARGS`` runs
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
