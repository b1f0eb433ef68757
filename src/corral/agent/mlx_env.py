"""Rank side of the ``mlx`` launcher (:mod:`corral.plan.launchers.mlx`), run by the worker
before the script.

It checks that MLX and the planned backend are there on this host, writes MLX's
ring hostfile from ``CORRAL_MLX_HOSTS`` (planning is pure, so the hostfile
travels in the env) and points ``MLX_HOSTFILE`` at it, then initialises MLX's
group with that backend, so the script's own ``mx.distributed.init()`` returns
it, and refuses a group whose size or rank is not the plan's (a rank that
silently ran alone would make a job "pass" falsely).

MLX's connect blocks without a timeout and holds the GIL, so the bound
``CORRAL_MLX_INIT_TIMEOUT`` is kept by :func:`faulthandler.dump_traceback_later`,
whose watchdog thread needs no GIL: past it, the rank prints where it waited
(``wait_for_mlx_peers``) and exits 1.

MLX notices a vanished peer within milliseconds, sooner than a node agent may
reap the rank that vanished; so a rank whose error is MLX's lost peer waits
``LOST_PEER_GRACE`` seconds before it exits (the job's teardown ends the wait),
and the rank that failed first is the one reported as the root cause.
"""

from __future__ import annotations

import atexit
import faulthandler
import json
import os
import socket
import sys
import tempfile
import time
from collections.abc import MutableMapping
from types import ModuleType
from typing import Any

from corral.contract import (
    ATTEMPT_ENV,
    HOST_ENV,
    MLX_BACKEND_ENV,
    MLX_HOSTS_ENV,
    MLX_INIT_TIMEOUT_ENV,
    NODE_DIR_ENV,
    error_file_path,
    read_error_file,
)

REFUSED = 1  # the rank's exit code when it cannot start MLX as planned
LOST_PEER = "connection to a peer was lost"  # MLX's error when a neighbour vanished
LOST_PEER_GRACE = 2.0

_BACKEND_HINTS = {
    "jaccl": " (jaccl needs macOS with RDMA over Thunderbolt; --mlx-backend ring works everywhere)",
}


def hostfile_path(node_dir: str | None, attempt: str, rank: int) -> str:
    """Where this rank's copy of MLX's hostfile goes: one per rank and attempt, so
    ranks of a node never race on one file and no attempt reads another's."""
    base = node_dir or tempfile.gettempdir()
    return os.path.join(base, "mlx", f"hostfile-attempt-{attempt}-rank-{rank}.json")


def write_hostfile(content: str, path: str) -> str:
    """Write MLX's hostfile ``content`` (JSON, validated) to ``path``, private to the
    user, atomically; return ``path``."""
    json.loads(content)  # a corrupt env value fails here, not deep inside MLX
    directory = os.path.dirname(path)
    os.makedirs(directory, mode=0o700, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".hostfile.", dir=directory)  # mode 0600
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(content)
        os.replace(tmp, path)
    except BaseException:
        os.unlink(tmp)
        raise
    return path


def _say(message: str) -> int:
    print(f"corral: {message}", file=sys.stderr, flush=True)
    return REFUSED


def _import_mlx() -> ModuleType:
    import mlx.core

    return mlx.core


def wait_for_mlx_peers(mx: Any, backend: str, timeout: float) -> Any:
    """MLX's group for ``backend``, or the process ends after ``timeout`` seconds."""
    if timeout > 0:
        faulthandler.dump_traceback_later(timeout, exit=True)
    try:
        return mx.distributed.init(strict=True, backend=backend)
    finally:
        if timeout > 0:
            faulthandler.cancel_dump_traceback_later()


def linger_after_lost_peer(grace: float = LOST_PEER_GRACE) -> None:
    """At exit: wait ``grace`` seconds when this rank's error file records MLX's lost
    peer (a consequence of another rank's end, which should be reported first)."""
    path = error_file_path()
    data = read_error_file(path) if path else None
    if data is not None and LOST_PEER in str(data.get("message", "")):
        time.sleep(grace)


def prepare(env: MutableMapping[str, str]) -> int | None:
    """Set up MLX for this rank as the plan in ``env`` says; None when the script
    may run, else the exit code (the reason is printed on stderr)."""
    backend = env[MLX_BACKEND_ENV]
    rank = int(env.get("RANK", "0"))
    world = int(env.get("WORLD_SIZE", "1"))
    host = env.get(HOST_ENV) or socket.gethostname()
    try:
        mx = _import_mlx()
    except ImportError as exc:
        return _say(
            f"--launcher mlx needs MLX for {sys.executable} on {host} ({exc}); install it "
            f"there: {sys.executable} -m pip install 'mlx[cpu]' (Linux) or mlx (macOS)"
        )
    version = getattr(mx, "__version__", "?")
    if not mx.distributed.is_available(backend):
        return _say(
            f"MLX's {backend} backend is not available on {host} (mlx {version}, "
            f"{sys.executable}){_BACKEND_HINTS.get(backend, '')}"
        )
    if world <= 1:
        return None  # MLX's singleton group: nothing to connect
    if MLX_HOSTS_ENV in env:
        path = hostfile_path(env.get(NODE_DIR_ENV), env.get(ATTEMPT_ENV, "0"), rank)
        try:
            env["MLX_HOSTFILE"] = write_hostfile(env[MLX_HOSTS_ENV], path)
        except (OSError, ValueError) as exc:
            return _say(f"cannot write MLX's hostfile {path}: {exc}")
    try:
        group = wait_for_mlx_peers(mx, backend, float(env.get(MLX_INIT_TIMEOUT_ENV, "0")))
    except RuntimeError as exc:
        return _say(f"MLX's {backend} group did not form on {host} (rank {rank}): {exc}")
    if group.size() != world or group.rank() != rank:
        return _say(
            f"MLX's {backend} group has {group.size()} ranks with this one as rank "
            f"{group.rank()}, but corral planned {world} ranks with this one as rank {rank}"
        )
    atexit.register(linger_after_lost_peer)
    return None
