"""On-demand stack dumps: ``SIGUSR1`` makes the process write every thread's stack.

corral's hang detection asks each rank where it is. It uses ``py-spy dump``
where it can; where it cannot (no py-spy, ptrace not permitted) it falls back
to this: the rank has registered :mod:`faulthandler` for :data:`DUMP_SIGNAL`,
writing to its stack file, and the node agent sends the signal and reads what
was appended. faulthandler writes from the C signal handler, so a rank blocked
in C (a collective, ``time.sleep``, a lock) still answers.

The stack file is ``$CORRAL_NODE_DIR/stacks/rank-<RANK>.txt``. corral's rank
wrapper registers it for every rank; a script started some other way calls
:func:`enable_stack_dumps` itself.
"""

from __future__ import annotations

import faulthandler
import os
import signal
import sys
import threading
from pathlib import Path
from typing import IO

from corral.contract import DUMP_SIGNAL, NODE_DIR_ENV, stack_file
from corral.sdk._env import info

__all__ = ["DUMP_SIGNAL", "enable_stack_dumps", "stack_file"]

#: The signal that makes a registered process dump its stacks.

_lock = threading.Lock()
_registered: tuple[int, Path, IO[str]] | None = None  # (pid, path, open file)


def _default_path() -> Path | None:
    node_dir = os.environ.get(NODE_DIR_ENV)
    if not node_dir:
        return None
    try:
        rank = int(os.environ.get("RANK") or 0)
    except ValueError:
        rank = info().rank  # raises ValueError naming the bad variable
    return stack_file(node_dir, rank)


def enable_stack_dumps(path: str | os.PathLike[str] | None = None) -> Path | None:
    """Make :data:`DUMP_SIGNAL` (``SIGUSR1``) dump all thread stacks to ``path``; return it.

    ``path`` defaults to ``$CORRAL_NODE_DIR/stacks/rank-<RANK>.txt``; without
    ``CORRAL_NODE_DIR`` (not run by corral) nothing is registered and None is
    returned. The file is opened for appending, so each dump is added after the
    previous one and a reader that truncates it between dumps gets no holes.

    Idempotent: calling it again with the same path does nothing; with another
    path the handler moves there. It replaces any other ``SIGUSR1`` handler of
    the process (no chaining: the default action of ``SIGUSR1`` is to exit).
    Never raises: where the file cannot be opened it prints why to stderr and
    returns None. Not available on platforms without ``SIGUSR1`` (None).
    """
    global _registered
    if not hasattr(signal, "SIGUSR1"):
        return None
    try:
        target = Path(path) if path is not None else _default_path()
    except ValueError as exc:
        print(f"corral: stack dumps disabled: {exc}", file=sys.stderr)
        return None
    if target is None:
        return None
    target = target.absolute()
    with _lock:
        if _registered is not None and _registered[:2] == (os.getpid(), target):
            return target
        try:
            target.parent.mkdir(parents=True, exist_ok=True)
            fd = os.open(target, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
            handle = os.fdopen(fd, "a", encoding="utf-8")  # kept open for the handler
        except OSError as exc:
            print(f"corral: stack dumps disabled: cannot open {target}: {exc}", file=sys.stderr)
            return None
        faulthandler.register(DUMP_SIGNAL, file=handle, all_threads=True, chain=False)
        previous, _registered = _registered, (os.getpid(), target, handle)
    if previous is not None and previous[0] == os.getpid():
        previous[2].close()
    return target
