"""Atomic, self-verifying checkpoints.

``save_checkpoint`` writes ``ckpt-{step:08d}.pt`` (``ckpt-{step:08d}-rank{rank:05d}.pt``
with ``all_ranks``) through a hidden temp file in the same directory: write,
flush, ``fsync``, ``os.replace``, ``fsync`` the directory. A crash therefore
leaves at worst a ``.ckpt-*.tmp-*`` file, which is never a candidate and is
removed by the next save.

Each completed rank-0 save is announced to the corral supervisor (when running
under corral) as a ``{"type": "checkpoint", "step", "path", "rank", "time"}``
line on the control socket, so the coordinator can keep a replica of it. With
``CORRAL_CHECKPOINT_REPLICA=wait`` (``corral run --replicate-checkpoints``) the
save returns only once the coordinator confirms that its replica holds the
checkpoint (or says why it could not copy it, printed as a warning), so losing
this host never loses more than the steps since this save. A
save that cannot be written (disk full, read-only or failing disk) raises
:class:`CheckpointWriteError` naming the host, the path and the cause; its temp
file is removed and the previous checkpoint is left as it was.

A relative directory or path given to these functions is resolved against
``$CORRAL_LAUNCH_DIR`` when corral sets it (``local:N`` nodes, whose ranks run
in their own node dir), so it names the same place on every run of the job
(:mod:`corral.sdk._paths`).

``latest_checkpoint`` also guards against files damaged some other way (a
partial copy, a non-atomic network filesystem, a torn page after power loss):
``torch.save`` writes a zip archive whose directory is at the end of the file,
so each candidate, newest first, is accepted only if that directory parses,
names a ``data.pkl`` and every entry lies within the file. This costs a few
small reads (no tensor data is read) and needs no torch; a truncated or
zero-tailed file fails it, and the next older checkpoint is used instead.
"""

from __future__ import annotations

import contextlib
import errno
import os
import socket
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import IO, Any

from corral.contract import (
    CHECKPOINT_REPLICA_ENV,
    HOST_ENV,
    checkpoint_files,
    fsync_dir,
    is_complete_checkpoint,
)
from corral.sdk._env import info
from corral.sdk._paths import job_path
from corral.sdk._report import request, send_event

__all__ = [
    "CheckpointWriteError",
    "checkpoint_files",
    "is_complete_checkpoint",
    "latest_checkpoint",
    "load_checkpoint",
    "load_state",
    "save_checkpoint",
]

#: ``wait``: a rank-0 save waits until the coordinator's replica holds it.
REPLICA_ENV = CHECKPOINT_REPLICA_ENV
REPLICA_TIMEOUT = 1800.0  # seconds a save waits for the coordinator's replica at most


def _torch() -> Any:
    try:
        import torch
    except ImportError as exc:
        raise ImportError("corral checkpoints need torch: pip install 'corral[torch]'") from exc
    return torch


def _filename(step: int, rank: int | None) -> str:
    return f"ckpt-{step:08d}.pt" if rank is None else f"ckpt-{step:08d}-rank{rank:05d}.pt"


class CheckpointWriteError(OSError):
    """A checkpoint could not be written (disk full, read-only or failing disk).

    The message names the host, the path and the cause, and which previous
    checkpoint is intact. ``errno`` is the underlying error number when known;
    ``host``, ``path``, ``cause`` and ``previous`` (a path or None) are attributes.
    """

    def __init__(
        self,
        message: str,
        *,
        host: str,
        path: str,
        cause: str,
        previous: str | None = None,
        code: int | None = None,
    ) -> None:
        if code is None:
            super().__init__(message)
        else:
            super().__init__(code, message)
        self.message = message
        self.host = host
        self.path = path
        self.cause = cause
        self.previous = previous
        self.filename = path

    def __str__(self) -> str:
        return self.message

    def __reduce__(self) -> tuple[Any, ...]:
        return (
            _rebuild_write_error,
            (self.message, self.host, self.path, self.cause, self.previous, self.errno),
        )


def _rebuild_write_error(
    message: str, host: str, path: str, cause: str, previous: str | None, code: int | None
) -> CheckpointWriteError:
    return CheckpointWriteError(
        message, host=host, path=path, cause=cause, previous=previous, code=code
    )


def save_checkpoint(
    state: Mapping[str, Any],
    directory: str | os.PathLike[str],
    step: int,
    *,
    keep: int | None = 3,
    all_ranks: bool = False,
) -> Path | None:
    """Atomically save ``state`` as step ``step``; return its path (None on ranks that skip).

    Only global rank 0 writes unless ``all_ranks`` (then every rank writes its
    own ``-rankNNNNN`` file). Afterwards the newest ``keep`` checkpoints of this
    family with a step <= ``step`` are kept and older ones deleted (``keep=None``
    keeps everything); files with a higher step are left alone. No collective
    is called, so ranks never wait on each other here.

    A rank-0 save is then announced to the supervisor (a no-op outside corral).
    Raises :class:`CheckpointWriteError` when the file cannot be written (the
    disk is full, ...): nothing of the new checkpoint is left and the previous
    ones are untouched.
    """
    if step < 0:
        raise ValueError(f"step must be >= 0, got {step}")
    if keep is not None and keep < 1:
        raise ValueError(f"keep must be >= 1 or None, got {keep}")
    torch = _torch()
    me = info()
    if not all_ranks and me.rank != 0:
        return None
    rank = me.rank if all_ranks else None
    folder = job_path(directory)
    final = folder / _filename(step, rank)
    tmp = folder / f".{final.name}.tmp-{os.getpid()}"
    try:
        folder.mkdir(parents=True, exist_ok=True)
        with open(tmp, "wb") as fh:
            torch.save(dict(state), fh)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, final)
    except BaseException as exc:
        with contextlib.suppress(OSError):  # e.g. the folder itself could not be made
            tmp.unlink(missing_ok=True)
        failure = _write_failure(exc, folder)
        if failure is None:
            raise
        raise _write_error(final, rank, failure) from exc
    fsync_dir(folder)
    _prune(folder, rank, step, keep)
    if rank is None:
        _announce(final, step, me.rank)
    return final


def _announce(final: Path, step: int, rank: int) -> None:
    """Tell the supervisor about a rank-0 checkpoint; with ``CORRAL_CHECKPOINT_REPLICA=wait``
    also wait until the coordinator's replica holds it."""
    event = {
        "type": "checkpoint",
        "step": step,
        "path": os.path.abspath(final),
        "rank": rank,
        "time": time.time(),
    }
    if os.environ.get(REPLICA_ENV, "") != "wait":
        send_event(event)
        return
    # a big checkpoint over a slow link can take a while; never forever
    reply = request(event, {"type": "replicated", "name": final.name}, timeout=REPLICA_TIMEOUT)
    if reply is not None and not reply.get("ok"):
        print(
            f"corral: warning: {final.name} is not in the coordinator's replica "
            f"({reply.get('error') or 'no reason given'}); it exists on this host only",
            file=sys.stderr,
            flush=True,
        )


# torch's zip writer turns a failed write into a RuntimeError (the OSError is its context)
_TORCH_WRITE_FAILURE = ("PytorchStreamWriter", "inline_container", "file write failed")
_LOW_SPACE = 1 << 20


def _write_failure(exc: BaseException, folder: Path) -> tuple[int | None, str] | None:
    """(errno, cause) when ``exc`` is a failure to write the file, else None."""
    if not isinstance(exc, Exception):
        return None  # KeyboardInterrupt, SystemExit: not a write failure
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if isinstance(current, OSError) and not isinstance(current, CheckpointWriteError):
            if current.errno is None:
                return None, str(current) or type(current).__name__
            text = current.strerror or os.strerror(current.errno)
            return current.errno, text[:1].lower() + text[1:]
        current = current.__cause__ or current.__context__
    if isinstance(exc, RuntimeError) and any(m in str(exc) for m in _TORCH_WRITE_FAILURE):
        try:
            st = os.statvfs(folder)
        except OSError:
            return None, str(exc)
        if st.f_bavail * st.f_frsize < _LOW_SPACE:
            return errno.ENOSPC, os.strerror(errno.ENOSPC).lower()
        return None, str(exc)
    return None


def _write_error(
    final: Path, rank: int | None, failure: tuple[int | None, str]
) -> CheckpointWriteError:
    code, cause = failure
    host = os.environ.get(HOST_ENV, "").strip() or socket.gethostname()
    previous = latest_checkpoint(final.parent, rank=rank)
    if previous is None:
        kept = f"no earlier checkpoint in {final.parent}"
    else:
        kept = f"the previous checkpoint {previous} is intact"
    path = os.path.abspath(final)
    return CheckpointWriteError(
        f"cannot save checkpoint {path} on host {host}: {cause}; {kept}",
        host=host,
        path=path,
        cause=cause,
        previous=None if previous is None else str(previous),
        code=code,
    )


def _prune(folder: Path, rank: int | None, step: int, keep: int | None) -> None:
    suffix = _filename(0, rank)[len("ckpt-00000000") :]
    for leftover in folder.glob(f".ckpt-*{suffix}.tmp-*"):
        leftover.unlink(missing_ok=True)
    if keep is None:
        return
    older = [path for s, path in checkpoint_files(folder, rank) if s <= step]
    for path in older[: max(0, len(older) - keep)]:
        try:
            path.unlink()
        except OSError as err:
            print(f"[corral] could not prune {path}: {err}", file=sys.stderr, flush=True)


def latest_checkpoint(directory: str | os.PathLike[str], *, rank: int | None = None) -> Path | None:
    """The newest complete checkpoint in ``directory``, or None.

    ``rank=None`` looks at rank-0 checkpoints (``ckpt-N.pt``); an integer looks
    at that rank's ``all_ranks`` files. Temp files are ignored and damaged files
    skipped (see the module docstring). With ``all_ranks`` checkpoints, ranks
    should agree on a step (e.g. an ``all_reduce`` MIN) before loading.
    """
    for _, path in reversed(checkpoint_files(job_path(directory), rank)):
        if is_complete_checkpoint(path):
            return path
    return None


def load_checkpoint(
    path: str | os.PathLike[str], map_location: Any = "cpu", *, weights_only: bool = True
) -> dict[str, Any]:
    """Load a checkpoint written by :func:`save_checkpoint` (tensors mapped to ``map_location``)."""
    where = job_path(path)
    return load_state(where, str(where), map_location, weights_only=weights_only)


def load_state(
    source: str | os.PathLike[str] | IO[bytes],
    label: str,
    map_location: Any = "cpu",
    *,
    weights_only: bool = True,
) -> dict[str, Any]:
    """:func:`load_checkpoint` from a path or a binary file object (``label`` names it)."""
    torch = _torch()
    state = torch.load(source, map_location=map_location, weights_only=weights_only)
    if not isinstance(state, dict):
        raise TypeError(f"{label} does not hold a dict (got {type(state).__name__})")
    return state
