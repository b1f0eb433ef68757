"""``python -m corral.actors.worker``: one actor worker process (started by the coordinator).

The process's stdin and stdout are its channel to the coordinator (the SSH
session, or a local pipe): nothing listens on a port. At start it

* keeps a private copy of stdout for the channel and points fd 1 (so ``print``
  and child processes) at stderr, which the coordinator streams as
  ``[host:rank]`` lines; fd 0 becomes ``/dev/null`` so nothing else reads frames;
* reads the init frame (its ranks, environment, working directory, work_fn),
  answers ``hello``, loads work_fn, answers ``ready`` and runs ``work_fn(handle)``;
* reads the channel in a thread: messages go to the handle's inbox; at EOF (the
  coordinator, or its SSH connection, is gone), or when the coordinator's
  heartbeats stop (SSH hosts: a link cut off), it SIGKILLs its descendants and
  its process group, itself included, so a lost coordinator leaves nothing;
* serves ``corral.sdk.report`` on an authenticated abstract Unix socket (Linux)
  and forwards each report to the coordinator.

An exception in work_fn is sent back (type, message, traceback) and the process
exits 1; a ``stop`` frame makes :meth:`CoordinatorHandle.recv` raise
:class:`Stopped` (a ``SystemExit(0)``).
"""

from __future__ import annotations

import contextlib
import ctypes
import hmac
import io
import os
import queue
import secrets
import signal
import socket
import struct
import sys
import threading
import time
import traceback
from collections.abc import Callable, Mapping
from typing import Any

from corral.actors import _framing as fr
from corral.actors._workfn import WorkFnSpec, load
from corral.actors.errors import ActorTimeout
from corral.contract import CONTROL_ENV, CONTROL_TOKEN_ENV, QOS_ENV

PR_SET_PDEATHSIG = 1
PR_SET_CHILD_SUBREAPER = 36
_STOP = object()


class Stopped(SystemExit):
    """The coordinator asked this worker to stop (``cluster.stop()``): raised by
    :meth:`CoordinatorHandle.recv`; left uncaught, the worker exits 0."""

    def __init__(self) -> None:
        super().__init__(0)


def _prctl(option: int, value: int) -> None:
    if sys.platform.startswith("linux"):
        with contextlib.suppress(OSError, AttributeError):
            ctypes.CDLL(None, use_errno=True).prctl(option, value, 0, 0, 0)


def reap_descendants() -> None:
    """SIGKILL every process this worker started that is still there (as a child
    subreaper it inherits orphaned grandchildren, so this finds them too)."""
    with contextlib.suppress(Exception):
        import psutil

        for child in psutil.Process().children(recursive=True):
            with contextlib.suppress(psutil.Error):
                child.kill()


def _kill_everything(reason: str) -> None:
    """SIGKILL every descendant and this process group (this process too); never returns."""
    with contextlib.suppress(Exception):
        os.write(2, f"corral actor: {reason}: exiting\n".encode())
    reap_descendants()
    if os.getpgrp() == os.getpid():
        with contextlib.suppress(OSError):
            os.killpg(os.getpgrp(), signal.SIGKILL)
    os._exit(1)


class CoordinatorHandle:
    """The worker's end of the channel, passed to ``work_fn``: ``send``, ``recv``,
    ``poll``, and where this worker sits (``host``, ``rank``, ``local_rank``,
    ``world_size``, ``local_world_size``, ``node_rank``)."""

    def __init__(self, out_fd: int, info: Mapping[str, Any]) -> None:
        self._out = out_fd
        self._lock = threading.Lock()
        self._inbox: queue.SimpleQueue[object] = queue.SimpleQueue()
        self._stopped = False
        #: The id of the last message work_fn received: every message sent answers it.
        self._answering = 0
        self.host: str = info["host"]
        self.rank: int = info["rank"]
        self.local_rank: int = info["local_rank"]
        self.world_size: int = info["world_size"]
        self.local_world_size: int = info["local_world_size"]
        self.node_rank: int = info["node_rank"]

    def __repr__(self) -> str:
        return f"CoordinatorHandle(host={self.host!r}, rank={self.rank})"

    # -- channel --------------------------------------------------------------------

    def _write(self, kind: int, body: bytes = b"", head: bytes = b"") -> None:
        try:
            with self._lock:
                fr.write_frame(self._out, kind, body, head=head)
        except OSError:
            _kill_everything("the coordinator is gone (channel closed)")

    def _deliver(self, item: object) -> None:
        self._inbox.put(item)

    # -- API ------------------------------------------------------------------------

    def send(self, obj: object) -> None:
        """Send ``obj`` (pickled) to the coordinator, as the answer to the last message
        received (the coordinator drops answers to a ``call`` that already failed)."""
        self._write(fr.MSG, fr.dumps(obj), fr.msg_head(self._answering))

    def recv(self, timeout: float | None = None) -> Any:
        """The next message from the coordinator (waits at most ``timeout`` seconds:
        ActorTimeout). Raises :class:`Stopped` once the coordinator stops the worker."""
        if self._stopped:
            raise Stopped()
        try:
            item = self._inbox.get(timeout=timeout)
        except queue.Empty:
            raise ActorTimeout(host=self.host, rank=self.rank, timeout=timeout or 0.0) from None
        if item is _STOP:
            self._stopped = True
            raise Stopped()
        assert isinstance(item, (bytes, bytearray))
        self._answering = fr.msg_id(item)
        return fr.msg_value(item)

    def poll(self, timeout: float = 0.0) -> bool:
        """Whether :meth:`recv` would return (or raise) at once, waiting up to ``timeout``."""
        if self._stopped or not self._inbox.empty():
            return True
        try:
            item = self._inbox.get(timeout=timeout) if timeout > 0 else self._inbox.get_nowait()
        except queue.Empty:
            return False
        # put it back in front: drain and requeue keeps the order
        rest = [item]
        while True:
            try:
                rest.append(self._inbox.get_nowait())
            except queue.Empty:
                break
        for entry in rest:
            self._inbox.put(entry)
        return True


class _Heard:
    """When the coordinator was last heard from (any frame)."""

    last = time.monotonic()


def _watchdog(timeout: float) -> None:
    """Kill everything once the coordinator has been silent for ``timeout`` seconds
    (a host cut off from it: no EOF ever comes)."""
    while True:
        time.sleep(min(1.0, timeout / 4))
        silent = time.monotonic() - _Heard.last
        if silent > timeout:
            _kill_everything(f"no heartbeat from the coordinator for {silent:.0f} s")


def _read_channel(channel: io.RawIOBase, handle: CoordinatorHandle) -> None:
    """The reader thread: frames to the inbox until EOF, then kill everything."""
    try:
        while True:
            frame = fr.read_frame(channel)
            _Heard.last = time.monotonic()
            if frame is None:
                break
            kind, body = frame
            if kind == fr.MSG:
                handle._deliver(body)
            elif kind == fr.STOP:
                handle._deliver(_STOP)
    except (OSError, EOFError, ValueError) as exc:
        _kill_everything(f"channel error ({exc})")
    _kill_everything("the coordinator is gone (stdin closed)")


class _ReportServer:
    """``corral.sdk.report`` inside a worker: an abstract Unix socket with a token
    (``CORRAL_CONTROL``/``CORRAL_CONTROL_TOKEN``); each JSON line goes to the
    coordinator as a report frame."""

    def __init__(self, forward: Callable[[bytes], None]) -> None:
        self.token = secrets.token_hex(16)
        self.name = f"corral-actor-{os.getpid()}-{secrets.token_hex(6)}"
        self._forward = forward
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._sock.bind("\0" + self.name)
        self._sock.listen(16)
        threading.Thread(target=self._accept, name="corral-report", daemon=True).start()

    def env(self) -> dict[str, str]:
        return {CONTROL_ENV: f"unix:@{self.name}", CONTROL_TOKEN_ENV: self.token}

    def _accept(self) -> None:
        while True:
            conn, _ = self._sock.accept()
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        if not _same_user(conn):  # an abstract socket has no file mode: check the peer
            conn.close()
            return
        with conn, conn.makefile("rb") as lines:
            first = lines.readline().strip()
            expected = b"auth " + self.token.encode()
            if not hmac.compare_digest(first, expected):
                return
            for line in lines:
                if line.startswith(b"{"):
                    self._forward(line.strip())


def _same_user(conn: socket.socket) -> bool:
    """Whether the peer of ``conn`` runs as this worker's user (SO_PEERCRED)."""
    try:
        creds = conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    except OSError:
        return False
    _pid, uid, _gid = struct.unpack("3i", creds)
    return bool(uid == os.getuid())


def _detect_interface(master_addr: str) -> str | None:
    try:
        from corral.agent.hostfacts import route_to

        found = route_to(master_addr).get("interface")
    except Exception:
        return None
    return str(found) if found else None


def _setup_process() -> tuple[io.RawIOBase, int]:
    """The channel's two ends; fd 1 now writes to stderr and fd 0 reads /dev/null."""
    # no PR_SET_PDEATHSIG here: the channel's EOF kills the whole group, children too
    _prctl(PR_SET_CHILD_SUBREAPER, 1)
    out_fd = os.dup(1)  # non-inheritable: children never hold the channel
    in_fd = os.dup(0)
    os.dup2(2, 1)
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    os.close(devnull)
    channel = io.FileIO(in_fd, "rb", closefd=True)

    def in_child() -> None:  # a fork of work_fn (DataLoader workers, ...) drops the channel
        with contextlib.suppress(OSError):
            os.close(out_fd)
        with contextlib.suppress(OSError):
            os.close(in_fd)
        _prctl(PR_SET_PDEATHSIG, signal.SIGKILL)

    os.register_at_fork(after_in_child=in_child)
    return channel, out_fd


def _error_body(exc: BaseException, phase: str) -> bytes:
    """The error frame's body; the traceback goes to stderr (the log file) too."""
    text = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
    with contextlib.suppress(OSError, ValueError):
        sys.stderr.write(text)
        sys.stderr.flush()
    return fr.encode_json(
        {"phase": phase, "type": type(exc).__name__, "message": str(exc), "traceback": text}
    )


def _apply_init(info: Mapping[str, Any]) -> str | None:
    """Working directory and environment from the init frame; the interface used."""
    workdir = info.get("workdir")
    if workdir:
        os.chdir(os.path.expanduser(workdir))
    elif info.get("default_workdir") and os.path.isdir(info["default_workdir"]):
        os.chdir(info["default_workdir"])
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    env: dict[str, str] = dict(info.get("env") or {})
    interface = info.get("interface") or None
    if interface is None and info.get("master_addr"):
        interface = _detect_interface(str(info["master_addr"]))
    if interface:
        env.setdefault("NCCL_SOCKET_IFNAME", interface)
        env.setdefault("GLOO_SOCKET_IFNAME", interface)
    os.environ.update(env)
    if os.environ.get(QOS_ENV):  # the job's --qos (macOS), before work_fn's threads
        from corral.sdk.runtime import apply_qos_from_env

        apply_qos_from_env()
    return interface


def main() -> int:
    """Run one worker: init, hello, ready, ``work_fn(handle)``; the exit code."""
    import corral

    channel, out_fd = _setup_process()
    first = fr.read_frame(channel)
    if first is None:
        return 0  # the coordinator went away before saying anything
    kind, body = first
    if kind != fr.INIT:
        os.write(2, b"corral actor: expected an init frame first\n")
        return 2
    info = fr.decode_json(body)
    handle = CoordinatorHandle(out_fd, info)
    if info.get("version") != corral.__version__:
        error = RuntimeError(
            f"this host runs corral {corral.__version__}, the coordinator "
            f"{info.get('version')}: install the same version on every host"
        )
        handle._write(fr.ERROR, _error_body(error, "start"))
        return 2
    reader = threading.Thread(
        target=_read_channel, args=(channel, handle), name="corral-channel", daemon=True
    )
    try:
        interface = _apply_init(info)
        if sys.platform.startswith("linux"):
            with contextlib.suppress(OSError):
                server = _ReportServer(lambda line: handle._write(fr.REPORT, line))
                os.environ.update(server.env())
        hello = {
            "pid": os.getpid(),
            "hostname": socket.gethostname(),
            "python": sys.executable,
            "interface": interface,
            "cwd": os.getcwd(),
        }
        handle._write(fr.HELLO, fr.encode_json(hello))
        reader.start()
        if info.get("heartbeat_timeout"):
            _Heard.last = time.monotonic()
            threading.Thread(
                target=_watchdog, args=(float(info["heartbeat_timeout"]),), daemon=True
            ).start()
        work_fn = load(WorkFnSpec.from_json(info["work_fn"]))
    except Exception as exc:
        handle._write(fr.ERROR, _error_body(exc, "start"))
        return 1
    handle._write(fr.READY)
    try:
        result = work_fn(handle)
    except SystemExit:
        raise
    except BaseException as exc:
        handle._write(fr.ERROR, _error_body(exc, "run"))
        return 1
    try:
        done = fr.dumps(result)
    except Exception:
        done = fr.dumps(None)
    handle._write(fr.DONE, done)
    return 0


if __name__ == "__main__":
    # run through the importable module, not this __main__ copy, so pickles and
    # isinstance checks see one CoordinatorHandle class
    from corral.actors.worker import main as _main
    from corral.actors.worker import reap_descendants as _reap

    try:
        sys.exit(_main())
    finally:
        _reap()  # nothing work_fn started outlives the worker
