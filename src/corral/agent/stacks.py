"""Dump the Python stacks of a node's ranks (hang detection, agent side).

``py-spy dump --pid PID`` first: it needs nothing from the rank and shows where
every thread is. Where py-spy is missing or cannot attach (ptrace not
permitted, e.g. ``kernel.yama.ptrace_scope`` or a container without
``CAP_SYS_PTRACE``) the rank is asked to dump itself: corral's rank wrapper (or
``sdk.enable_stack_dumps()``) registered :mod:`faulthandler` for ``SIGUSR1``,
writing to ``<node_dir>/stacks/rank-<rank>.txt``; the signal is sent only when
``/proc`` shows the process catches it (the default action of ``SIGUSR1``
would kill it), and what the handler appended to the file is the dump.

Every dump is also kept on the node in ``<node_dir>/hang/rank-<rank>.txt``.

On a node with NVIDIA GPUs the agent turns PyTorch's NCCL flight recorder on
for its ranks (:func:`corral.agent.spawn.flight_recorder_env`: a bounded trace
buffer, a dump on the watchdog's timeout and on request through a named pipe,
all under ``<node_dir>/nccl/``); on a hang each rank is asked for its dump
(:func:`collect_traces`), which travels with its stack to the coordinator.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Literal

import psutil

from corral.agent.protocol import EVENT_TEXT_LIMIT
from corral.contract import DUMP_SIGNAL, stack_file
from corral.private import private_dir, write_private

__all__ = [
    "EVENT_TEXT_LIMIT",
    "TRACE_LIMIT",
    "StackDump",
    "collect_traces",
    "dump_event",
    "dump_stack",
    "dump_stacks",
    "find_py_spy",
    "hang_file",
]

DumpMethod = Literal["py-spy", "faulthandler", "none"]

FAULTHANDLER_WAIT = 2.0  # how long a signalled rank gets to write its dump
_SETTLE = 0.1  # the dump is complete once the file stopped growing for this long
_POLL = 0.02
#: Largest flight recorder dump sent to the coordinator (bytes; larger ones stay on the node).
TRACE_LIMIT = 1 << 20
TRACE_WAIT = 3.0  # how long a rank gets to write its flight recorder dump


@dataclass
class StackDump:
    """The stacks of one rank: how they were taken, the dump, and what went wrong."""

    rank: int
    pid: int
    method: DumpMethod
    text: str
    error: str | None = None
    trace: str | None = None  # the NCCL flight recorder dump, base64

    def to_json(self) -> dict[str, Any]:
        """The event form: ``{"rank", "pid", "method", "text", "error", "trace"}``."""
        return asdict(self)

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> StackDump:
        """Read back :meth:`to_json` (as received by the coordinator)."""
        method = data.get("method")
        return cls(
            rank=int(data["rank"]),
            pid=int(data.get("pid") or 0),
            method=method if method in ("py-spy", "faulthandler") else "none",
            text=str(data.get("text") or ""),
            error=None if data.get("error") is None else str(data["error"]),
            trace=None if data.get("trace") is None else str(data["trace"]),
        )

    def render(self) -> str:
        """The file content: the dump, plus a note when something went wrong."""
        if not self.text.strip():
            return f"# corral: no stack dump of rank {self.rank}: {self.error or 'empty'}\n"
        note = f"# corral: {self.method} dump; {self.error}\n" if self.error else ""
        return self.text.rstrip("\n") + "\n" + note


def hang_file(node_dir: Path, rank: int) -> Path:
    """Where the node keeps rank ``rank``'s hang dump."""
    return node_dir / "hang" / f"rank-{rank}.txt"


def find_py_spy() -> str | None:
    """The py-spy binary: next to this interpreter (installed with corral), else on PATH."""
    beside = Path(sys.executable).parent / "py-spy"
    if beside.is_file() and os.access(beside, os.X_OK):
        return str(beside)
    return shutil.which("py-spy")


def _first_error_line(stderr: str, code: int) -> str:
    for line in stderr.splitlines():
        if line.strip():
            return line.strip().removeprefix("Error: ")
    return f"exited with code {code}"


def _py_spy(binary: str, pid: int, timeout: float) -> tuple[str | None, str | None]:
    """(dump, None) or (None, why py-spy gave none)."""
    env = dict(os.environ, RUST_BACKTRACE="0", RUST_LIB_BACKTRACE="0")
    try:
        done = subprocess.run(
            [binary, "dump", "--pid", str(pid)],
            capture_output=True,
            text=True,
            errors="replace",
            timeout=timeout,
            env=env,
            stdin=subprocess.DEVNULL,
        )
    except subprocess.TimeoutExpired:
        # py-spy pauses the process while it reads it; make sure it runs again.
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGCONT)
        return None, f"py-spy timed out after {timeout:g} s"
    except OSError as exc:
        return None, f"cannot run py-spy: {exc}"
    if done.returncode != 0:
        return None, f"py-spy: {_first_error_line(done.stderr, done.returncode)}"
    return done.stdout, None


def _catches(pid: int, signum: int, path: Path) -> bool:
    """Whether ``pid`` handles ``signum`` (so sending it cannot kill the process).

    Linux: the ``SigCgt`` mask of ``/proc/PID/status``. Elsewhere: the stack
    file exists and was written since the process started (it is created when
    the handler is registered).
    """
    try:
        with open(f"/proc/{pid}/status", encoding="ascii", errors="replace") as status:
            for line in status:
                if line.startswith("SigCgt:"):
                    return bool(int(line.split()[1], 16) >> (signum - 1) & 1)
    except (OSError, ValueError, IndexError):
        pass
    try:
        return path.stat().st_mtime >= psutil.Process(pid).create_time() - 1.0
    except (OSError, psutil.Error):
        return False


def _faulthandler(pid: int, rank: int, node_dir: Path, wait: float) -> tuple[str | None, str]:
    """(dump, "") or (None, why there is none): signal the rank, read what it appended."""
    path = stack_file(node_dir, rank)
    if not _catches(pid, DUMP_SIGNAL, path):
        return None, (
            "the process has no stack dump handler (SIGUSR1 not caught: run it with"
            " corral's worker or call corral.sdk.enable_stack_dumps())"
        )
    try:
        start = path.stat().st_size
    except OSError:
        return None, f"no stack file {path} (the rank registered its handler elsewhere)"
    try:
        os.kill(pid, DUMP_SIGNAL)
    except OSError as exc:
        return None, f"cannot signal pid {pid}: {exc}"
    deadline = time.monotonic() + wait
    size, changed = start, time.monotonic()
    while time.monotonic() < deadline:
        time.sleep(_POLL)
        try:
            now_size = path.stat().st_size
        except OSError:
            break
        if now_size != size:
            size, changed = now_size, time.monotonic()
        elif size > start and time.monotonic() - changed >= _SETTLE:
            break
    if size <= start:
        return None, f"no stack dump in {path} within {wait:g} s of SIGUSR1"
    with open(path, "rb") as handle:
        handle.seek(start)
        return handle.read(size - start).decode("utf-8", "replace"), ""


def _alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def dump_stack(pid: int, rank: int, node_dir: Path, timeout: float = 10.0) -> StackDump:
    """Dump the Python stacks of rank ``rank`` (process ``pid``); never raises.

    py-spy (at most ``timeout`` seconds) first, else the faulthandler fallback
    (at most :data:`FAULTHANDLER_WAIT` more). ``method`` says which one gave
    ``text``; ``"none"`` with ``error`` when neither did. ``error`` also keeps
    why py-spy failed when the fallback worked.
    """
    if not _alive(pid):
        return StackDump(rank, pid, "none", "", f"process {pid} is not running")
    spy_error: str | None = None
    binary = find_py_spy()
    if binary is None:
        spy_error = "py-spy not found"
    else:
        text, spy_error = _py_spy(binary, pid, timeout)
        if text is not None:
            return StackDump(rank, pid, "py-spy", text)
    text, fh_error = _faulthandler(pid, rank, Path(node_dir), min(FAULTHANDLER_WAIT, timeout))
    if text is not None:
        return StackDump(rank, pid, "faulthandler", text, spy_error)
    return StackDump(rank, pid, "none", "", f"{spy_error}; {fh_error}")


def dump_stacks(ranks: Mapping[int, int], node_dir: Path, timeout: float = 10.0) -> list[StackDump]:
    """Dump every rank of ``ranks`` (rank -> pid) at once; keep each in ``hang_file``.

    Returns the dumps in rank order. A dump that cannot be written to the node
    still comes back (its ``error`` says why the file is missing).
    """
    node_dir = Path(node_dir)
    items = sorted(ranks.items())
    if not items:
        return []
    with ThreadPoolExecutor(max_workers=min(len(items), 16)) as pool:
        dumps = list(pool.map(lambda item: dump_stack(item[1], item[0], node_dir, timeout), items))
    traces = collect_traces([rank for rank, _ in items], node_dir)
    for dump in dumps:
        dump.trace = traces.get(dump.rank)
    for dump in dumps:
        target = hang_file(node_dir, dump.rank)
        try:
            private_dir(target.parent)
            write_private(target, dump.render())
        except OSError as exc:
            note = f"not kept on the node: {exc}"
            dump.error = f"{dump.error}; {note}" if dump.error else note
    return dumps


def collect_traces(ranks: list[int], node_dir: Path, wait: float = TRACE_WAIT) -> dict[int, str]:
    """Each rank's NCCL flight recorder dump (base64), where the recorder is on.

    A rank with a request pipe (``nccl/pipe_<rank>.pipe``, made by
    ProcessGroupNCCL) is asked to dump through it and waited for (at most ``wait``
    seconds for all); a dump already there (the watchdog's, on its timeout) is
    taken as it is. Dumps over :data:`TRACE_LIMIT` bytes stay on the node."""
    folder = Path(node_dir) / "nccl"
    if not folder.is_dir():
        return {}
    asked: dict[int, float] = {}
    for rank in ranks:
        pipe = folder / f"pipe_{rank}.pipe"
        with contextlib.suppress(OSError):
            fd = os.open(pipe, os.O_WRONLY | os.O_NONBLOCK)
            try:
                os.write(fd, b"1\n")
                asked[rank] = time.time()
            finally:
                os.close(fd)
    deadline = time.monotonic() + wait
    while asked and time.monotonic() < deadline:
        fresh = [r for r, t in asked.items() if _mtime(folder / f"rank_{r}") >= t - 1.0]
        if len(fresh) == len(asked):
            time.sleep(_SETTLE)  # let the last write finish
            break
        time.sleep(_POLL * 5)
    traces: dict[int, str] = {}
    for rank in ranks:
        path = folder / f"rank_{rank}"
        with contextlib.suppress(OSError):
            if 0 < path.stat().st_size <= TRACE_LIMIT:
                traces[rank] = base64.b64encode(path.read_bytes()).decode("ascii")
    return traces


def _mtime(path: Path) -> float:
    try:
        return path.stat().st_mtime
    except OSError:
        return 0.0


async def dump_event(
    ranks: Mapping[int, int], node_dir: Path, timeout: float = 10.0
) -> dict[str, Any]:
    """The fields of the agent's ``stacks`` event: ``{"stacks": [StackDump.to_json(), ...]}``.

    Runs :func:`dump_stacks` in a thread. Texts longer than
    :data:`EVENT_TEXT_LIMIT` are cut with a note, keeping the part with the main
    thread (the end of a faulthandler dump, the start of a py-spy one); the
    node's files keep them whole.
    """
    dumps = await asyncio.to_thread(dump_stacks, dict(ranks), Path(node_dir), timeout)
    stacks = []
    for dump in dumps:
        data = dump.to_json()
        if len(dump.text) > EVENT_TEXT_LIMIT:
            note = (
                f"# corral: cut to {EVENT_TEXT_LIMIT} characters;"
                f" the whole dump is in {hang_file(Path(node_dir), dump.rank)} on the node\n"
            )
            if dump.method == "faulthandler":  # the main thread comes last
                data["text"] = note + dump.text[-EVENT_TEXT_LIMIT:]
            else:  # py-spy: the main thread comes first
                data["text"] = dump.text[:EVENT_TEXT_LIMIT] + "\n" + note
        stacks.append(data)
    return {"stacks": stacks}
