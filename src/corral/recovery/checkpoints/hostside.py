"""What runs on a host to list, send and receive checkpoints (standard library only).

Shipped over stdin with :mod:`corral.remote.python` together with
:mod:`corral.contract` (see :data:`corral.recovery.checkpoints.SHIPPED`), so the
host needs neither corral nor torch; it reads its own input through ``sys.stdin.buffer`` only (what
follows the program there). The coordinator side is the rest of
:mod:`corral.recovery.checkpoints`.

Only rank-0 checkpoints (``ckpt-{step:08d}.pt``, as written by
``sdk.save_checkpoint``) are handled. A checkpoint directory is resolved on the
host like the ranks do: relative to ``cwd`` (the node's working directory),
``~`` expanded.

Protocols (one process each):

``list_checkpoints(directory, cwd)``
    prints one JSON line: ``directory`` (absolute), ``exists``, ``free`` (bytes
    available to an unprivileged writer of the directory or of its nearest
    existing parent), ``host`` and ``files`` (``name``, ``step``, ``size``,
    ``complete``, ``mtime``; oldest first).

``send(path)``
    prints a JSON header line ``{"size": N, "path": ...}`` (or ``{"error": ...}``
    and exits 1), then streams the file's bytes to stdout under credit-based flow
    control: each stdin line is a decimal number of further bytes it may send, so
    a slow reader never makes anything buffer more than what it granted. After
    the last byte a trailer line ``{"sha256": HEX}``. Exits 1 when stdin closes
    before the end (the coordinator gave up).

``serve()``
    a long-lived ``send``: each stdin line ``{"send": PATH}`` is answered exactly
    like ``send(PATH)`` (header, granted bytes, trailer; an unreadable file gets
    the error header and the server waits for the next request). Exits 0 when
    stdin closes between requests, 1 when it closes mid-file. The replica keeps
    one per host, so a checkpoint is copied without starting a new session.

``receive(directory, cwd, name, size, sha256)``
    reads exactly ``size`` bytes from stdin into a hidden temp file
    ``.NAME.tmp-HOST-PID`` in the directory (never a checkpoint candidate, removed
    by the next ``save_checkpoint``; the host name keeps the copies of hosts
    sharing the directory apart), printing ``{"ack": BYTES}`` after every
    :data:`ACK_EVERY` bytes written. With ``sha256`` None the expected digest
    follows the data as a trailer line ``{"sha256": HEX}``. The digest is
    verified and the file checked to be a whole checkpoint, then ``fsync``,
    ``os.replace`` to ``NAME``, ``fsync`` of the directory, and one final line
    ``{"ok": true, "path", "size", "sha256"}``. On any failure (including
    SIGTERM/SIGHUP) the temp file is removed, ``{"ok": false, "error", "errno",
    "path"}`` is printed and the exit status is 1; a full disk is reported as
    ``no space left on device`` with the path.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import os
import re
import signal
import socket
import sys
from types import FrameType
from typing import IO, Any

from corral.contract import checkpoint_files, fsync_dir, is_complete_checkpoint

__all__ = ["ACK_EVERY", "CHUNK", "list_checkpoints", "receive", "send", "serve"]

#: Largest piece read or written at once.
CHUNK = 1 << 20
#: The receiver acknowledges progress after every this many bytes written.
ACK_EVERY = 1 << 20

_RANK0_NAME = re.compile(r"ckpt-\d+\.pt")
_CLEANUP_SIGNALS = (signal.SIGTERM, signal.SIGHUP)
_SPACE_ERRNOS = (errno.ENOSPC, getattr(errno, "EDQUOT", errno.ENOSPC))


def _resolve(directory: str, cwd: str | None) -> str:
    path = os.path.expanduser(directory)
    if cwd and not os.path.isabs(path):
        path = os.path.join(os.path.expanduser(cwd), path)
    return os.path.abspath(path)


def free_bytes(path: str) -> int | None:
    """Bytes an unprivileged writer may still use in ``path`` (or its nearest existing parent)."""
    probe = path
    while True:
        try:
            st = os.statvfs(probe)
        except OSError:
            parent = os.path.dirname(probe)
            if parent == probe:
                return None
            probe = parent
            continue
        return int(st.f_bavail) * int(st.f_frsize)


def _emit(out: IO[bytes], payload: dict[str, Any]) -> None:
    out.write((json.dumps(payload) + "\n").encode())
    out.flush()


def list_checkpoints(directory: str, cwd: str | None = None) -> int:
    """Print the rank-0 checkpoints of ``directory`` on this host (one JSON line)."""
    resolved = _resolve(directory, cwd)
    files: list[dict[str, Any]] = []
    for step, path in checkpoint_files(resolved):
        try:
            st = path.stat()
        except OSError:
            continue  # pruned while we looked
        files.append(
            {
                "name": path.name,
                "step": step,
                "size": st.st_size,
                "complete": is_complete_checkpoint(path),
                "mtime": st.st_mtime,
            }
        )
    _emit(
        sys.stdout.buffer,
        {
            "directory": resolved,
            "exists": os.path.isdir(resolved),
            "free": free_bytes(resolved),
            "host": socket.gethostname(),
            "files": files,
        },
    )
    return 0


def send(path: str) -> int:
    """Stream ``path`` to stdout as granted by the credit lines on stdin (see the module doc)."""
    return 0 if _send(path, sys.stdout.buffer, sys.stdin.buffer) == "sent" else 1


def serve() -> int:
    """Answer ``{"send": PATH}`` lines on stdin one after another (see the module doc)."""
    out = sys.stdout.buffer
    requests = sys.stdin.buffer
    while line := requests.readline():
        try:
            path = json.loads(line)["send"]
        except (ValueError, KeyError, TypeError):
            path = None
        if not isinstance(path, str):
            _emit(out, {"error": f"bad request {line[:80]!r}", "errno": None})
        elif _send(path, out, requests) == "broken":
            return 1
    return 0


def _send(path: str, out: IO[bytes], credits: IO[bytes]) -> str:
    """``sent``; ``unreadable`` (the error header went out instead); ``broken``
    (the stream stopped mid-file: the other side gave up, or the file shrank)."""
    try:
        fh = open(path, "rb")  # noqa: SIM115 - closed below, after the streaming loop
    except OSError as exc:
        _emit(out, {"error": f"cannot read {path}: {exc.strerror}", "errno": _errno_name(exc)})
        return "unreadable"
    with fh:
        size = os.fstat(fh.fileno()).st_size
        _emit(out, {"size": size, "path": os.path.abspath(path)})
        digest = hashlib.sha256()
        sent = allowed = 0
        while sent < size:
            while allowed <= sent:
                line = credits.readline()
                if not line:
                    return "broken"  # the coordinator gave up
                allowed += int(line)
            data = fh.read(min(CHUNK, allowed - sent, size - sent))
            if not data:
                print(f"{path} shrank while it was sent ({sent} of {size} bytes)", file=sys.stderr)
                return "broken"
            out.write(data)
            out.flush()
            digest.update(data)
            sent += len(data)
        _emit(out, {"sha256": digest.hexdigest()})
    return "sent"


def _errno_name(exc: OSError) -> str | None:
    return errno.errorcode.get(exc.errno) if exc.errno is not None else None


class _Interrupted(Exception):
    """SIGTERM/SIGHUP while receiving: clean up and report."""


def _interrupt(signum: int, frame: FrameType | None) -> None:
    raise _Interrupted(f"interrupted by signal {signal.Signals(signum).name}")


def _expected_digest(stream: IO[bytes], given: str | None) -> str:
    if given:
        return given.lower()
    line = stream.readline(4096)
    try:
        value = json.loads(line)["sha256"]
    except (ValueError, KeyError, TypeError):
        raise ValueError("no checksum trailer after the data") from None
    if not isinstance(value, str):
        raise ValueError("malformed checksum trailer")
    return value.lower()


def receive(
    directory: str, cwd: str | None, name: str, size: int, sha256: str | None = None
) -> int:
    """Write ``size`` bytes from stdin to ``directory/name`` atomically (see the module doc)."""
    out = sys.stdout.buffer
    if not _RANK0_NAME.fullmatch(name):
        _emit(out, {"ok": False, "error": f"not a checkpoint name: {name!r}", "errno": None})
        return 1
    folder = _resolve(directory, cwd)
    final = os.path.join(folder, name)
    tmp = os.path.join(folder, f".{name}.tmp-{socket.gethostname()}-{os.getpid()}")
    previous = {signum: signal.signal(signum, _interrupt) for signum in _CLEANUP_SIGNALS}
    try:
        return _receive(out, folder, final, tmp, size, sha256)
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)


def _receive(
    out: IO[bytes], folder: str, final: str, tmp: str, size: int, sha256: str | None
) -> int:
    written = 0
    fd: int | None = None
    try:
        os.makedirs(folder, exist_ok=True)
        free = free_bytes(folder)
        if free is not None and free < size:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)  # left by an earlier process with the same PID
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        stream = sys.stdin.buffer
        digest = hashlib.sha256()
        acked = 0
        while written < size:
            data = stream.read(min(CHUNK, size - written))
            if not data:
                raise EOFError(f"the stream ended after {written} of {size} bytes")
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
            digest.update(data)
            written += len(data)
            if written - acked >= ACK_EVERY:
                acked = written
                _emit(out, {"ack": written})
        expected = _expected_digest(stream, sha256)
        if digest.hexdigest() != expected:
            raise ValueError(f"checksum mismatch: got {digest.hexdigest()}, expected {expected}")
        os.fsync(fd)
        os.close(fd)
        fd = None
        if not is_complete_checkpoint(tmp):
            raise ValueError("the received file is not a complete checkpoint")
        os.replace(tmp, final)
    except (OSError, EOFError, ValueError, _Interrupted, KeyboardInterrupt) as exc:
        if fd is not None:
            with contextlib.suppress(OSError):
                os.close(fd)
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        _emit(out, {"ok": False, "path": final, **_describe(exc, final, written, size, folder)})
        return 1
    fsync_dir(folder)
    _emit(out, {"ok": True, "path": final, "size": size, "sha256": digest.hexdigest()})
    return 0


def _describe(
    exc: BaseException, final: str, written: int, size: int, folder: str
) -> dict[str, Any]:
    if isinstance(exc, OSError):
        if exc.errno in _SPACE_ERRNOS:
            free = free_bytes(folder)
            room = "" if free is None else f", {free} bytes free"
            need = f"{size} bytes needed{room}"
            return {
                "error": f"cannot write {final}: no space left on device ({need})",
                "errno": _errno_name(exc),
            }
        what = exc.strerror or str(exc)
        return {"error": f"cannot write {final}: {what}", "errno": _errno_name(exc)}
    return {"error": f"cannot write {final}: {exc}", "errno": None}
