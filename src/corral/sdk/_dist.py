"""Process-group setup with a master-readiness wait and explicit timeouts."""

from __future__ import annotations

import atexit
import gc
import os
import socket
import sys
import time
from datetime import timedelta

from corral.contract import BACKEND_ENV, DIST_TIMEOUT_ENV, RDZV_TIMEOUT_ENV
from corral.sdk._env import info

__all__ = [
    "MasterNotReadyError",
    "barrier",
    "cleanup",
    "destroy",
    "init_distributed",
    "wait_for_master",
]

DEFAULT_TIMEOUT = timedelta(seconds=300)
_REMINDER_EVERY = 30.0  # seconds between repeated "waiting" lines


class MasterNotReadyError(TimeoutError):
    """The master did not accept TCP connections before the deadline."""

    def __init__(self, host: str, port: int, timeout: float, last_error: str | None) -> None:
        self.host = host
        self.port = port
        self.timeout = timeout
        self.last_error = last_error
        why = f" (last error: {last_error})" if last_error else ""
        super().__init__(
            f"master {host}:{port} did not accept connections within {timeout:g}s{why}; "
            "check that rank 0 started, MASTER_ADDR/MASTER_PORT and the firewall"
        )


def _log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def _seconds(value: timedelta | float, name: str) -> float:
    seconds = value.total_seconds() if isinstance(value, timedelta) else float(value)
    if not seconds > 0:
        raise ValueError(f"{name} must be positive, got {value!r}")
    return seconds


def _env_seconds(name: str) -> float | None:
    """A positive number of seconds from ``$name``; None when unset; ValueError when bad."""
    raw = os.environ.get(name, "").strip()
    if not raw:
        return None
    try:
        return _seconds(float(raw), name)
    except ValueError:
        raise ValueError(f"${name}={raw!r} is not a positive number of seconds") from None


def wait_for_master(host: str, port: int, timeout: timedelta | float = DEFAULT_TIMEOUT) -> None:
    """Block until ``host:port`` accepts a TCP connection, or raise :class:`MasterNotReadyError`.

    Name-resolution failures and refused connections are retried with a short
    backoff (the master's address may appear late, e.g. a DNS record).
    """
    limit = _seconds(timeout, "master_timeout")
    deadline = time.monotonic() + limit
    _log(f"Waiting for master {host}:{port}...")
    delay = 0.05
    next_reminder = time.monotonic() + _REMINDER_EVERY
    last_error: str | None = None
    while True:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise MasterNotReadyError(host, port, limit, last_error)
        try:
            with socket.create_connection((host, port), timeout=min(remaining, 5.0)):
                pass
        except OSError as exc:
            last_error = f"{type(exc).__name__}: {exc}"
        else:
            _log(f"Master node {host}:{port} is ready for connections")
            return
        now = time.monotonic()
        if now >= next_reminder:
            _log(f"Still waiting for master {host}:{port} ({last_error})")
            next_reminder = now + _REMINDER_EVERY
        time.sleep(max(0.0, min(delay, deadline - now)))
        delay = min(delay * 2, 1.0)


def init_distributed(
    backend: str = "auto",
    timeout: timedelta | float | None = None,
    master_timeout: timedelta | float | None = None,
) -> bool:
    """Initialise ``torch.distributed`` from the environment; return whether a group is up.

    With ``WORLD_SIZE`` <= 1 (plain ``python``) this is a no-op returning False:
    no process group is created, and :func:`barrier`/:func:`cleanup` stay no-ops.
    Otherwise ranks other than 0 first wait (up to ``master_timeout``, default
    ``timeout``) for ``MASTER_ADDR:MASTER_PORT`` to accept connections; rank 0
    hosts the store itself and does not wait. Then the group is created with
    ``init_method="env://"`` and ``timeout``. ``backend="auto"`` takes
    ``$CORRAL_BACKEND`` when the job sets it (``--env CORRAL_BACKEND=gloo``), else picks
    ``nccl`` when CUDA is available (and selects the ``LOCAL_RANK`` device), else ``gloo``.
    Calling it again once the group is up returns True without doing anything.

    Defaults when not given: ``timeout`` from ``$CORRAL_DIST_TIMEOUT`` (set by the
    Kubernetes and Slurm renders), else 300 s; ``master_timeout`` from
    ``$CORRAL_RDZV_TIMEOUT``, else ``timeout``.
    """
    if timeout is None:
        timeout = _env_seconds(DIST_TIMEOUT_ENV) or DEFAULT_TIMEOUT
    if master_timeout is None:
        master_timeout = _env_seconds(RDZV_TIMEOUT_ENV)
    me = info()
    if me.world_size <= 1:
        return False
    pg_timeout = timedelta(seconds=_seconds(timeout, "timeout"))
    if not os.environ.get("MASTER_ADDR") or not os.environ.get("MASTER_PORT"):
        raise RuntimeError(
            f"WORLD_SIZE={me.world_size} but MASTER_ADDR/MASTER_PORT are not set; "
            "launch with corral or torchrun"
        )
    import torch
    import torch.distributed as dist

    if dist.is_initialized():
        return True
    if me.rank != 0:
        wait_for_master(
            me.master_addr, me.master_port, pg_timeout if master_timeout is None else master_timeout
        )
    if backend == "auto":
        backend = os.environ.get(BACKEND_ENV, "").strip().lower() or "auto"
    if backend == "auto":
        backend = "nccl" if torch.cuda.is_available() else "gloo"
    if backend == "nccl" and torch.cuda.is_available():
        torch.cuda.set_device(me.local_rank % max(1, torch.cuda.device_count()))
    _log(
        f"Initializing distributed process group: rank={me.rank}, "
        f"world_size={me.world_size}, timeout={pg_timeout}"
    )
    collect_garbage_at_exit()
    dist.init_process_group(
        backend=backend,
        init_method="env://",
        timeout=pg_timeout,
        rank=me.rank,
        world_size=me.world_size,
    )
    return True


_COLLECT_REGISTERED = False


def collect_garbage_at_exit() -> None:
    """Run a garbage collection at exit, before the interpreter tears itself down (once).

    A DDP wrapper is a reference cycle. Left to the interpreter's final collection, its
    reducer can abort the process after the group is gone (SIGABRT, "terminate called
    without an active exception"), turning a finished rank into a failed one.
    """
    global _COLLECT_REGISTERED
    if not _COLLECT_REGISTERED:
        _COLLECT_REGISTERED = True
        atexit.register(gc.collect)


def barrier() -> None:
    """Synchronise all ranks; a no-op when no process group is up."""
    if _initialized():
        import torch.distributed as dist

        dist.barrier()


def cleanup() -> None:
    """Destroy the process group if one is up (safe to call more than once)."""
    if _initialized():
        import torch.distributed as dist

        gc.collect()  # unreachable DDP wrappers go while their group still exists
        dist.destroy_process_group()


destroy = cleanup


def _initialized() -> bool:
    if "torch" not in sys.modules:  # nothing can be initialised without torch imported
        return False
    try:
        import torch.distributed as dist
    except ImportError:
        return False
    return bool(dist.is_available() and dist.is_initialized())
