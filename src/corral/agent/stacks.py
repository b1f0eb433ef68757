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

The agent turns PyTorch's flight recorder on for its ranks (:mod:`corral.agent.flight`,
``<node_dir>/flight/``); on a hang each rank is asked for its dump before the stacks
are taken (:func:`request_traces`) and waited for, at most ``trace_wait`` seconds
(:func:`gather_traces`); the dump, or why there is none, travels with the rank's
stack to the coordinator.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import os
import pickletools
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Literal

import psutil

from corral.agent.flight import (
    FOLDER,
    TRACE_WAIT,
    dump_file,
    error_file,
    nccl_dump_file,
    nccl_pipe,
    request_file,
)
from corral.agent.protocol import EVENT_TEXT_LIMIT, MAX_FRAME, TRACE_LIMIT
from corral.contract import DUMP_SIGNAL, FLIGHT_RECORDER_ENV, TRACE_WAIT_ENV, stack_file
from corral.private import private_dir, write_private

__all__ = [
    "EVENT_TEXT_LIMIT",
    "TRACES_PER_EVENT",
    "TRACE_LIMIT",
    "TRACE_WAIT",
    "StackDump",
    "TraceRequest",
    "collect_traces",
    "dump_event",
    "dump_stack",
    "dump_stacks",
    "find_py_spy",
    "gather_traces",
    "hang_file",
    "request_traces",
]

DumpMethod = Literal["py-spy", "faulthandler", "none"]

FAULTHANDLER_WAIT = 2.0  # how long a signalled rank gets to write its dump
_SETTLE = 0.1  # the dump is complete once the file stopped growing for this long
_POLL = 0.02
#: The most flight recorder dump text one ``stacks`` event carries (its frame's limit
#: less room for the stacks).
TRACES_PER_EVENT = MAX_FRAME // 2
FLIGHT_RECORDER_OFF = f"{FLIGHT_RECORDER_ENV}=0, or its folder could not be made"


@dataclass
class StackDump:
    """The stacks of one rank: how they were taken, the dump, and what went wrong."""

    rank: int
    pid: int
    method: DumpMethod
    text: str
    error: str | None = None
    trace: str | None = None  # the flight recorder dump, base64
    trace_error: str | None = None  # why there is no ``trace``

    def to_json(self) -> dict[str, Any]:
        """The event form: ``{"rank", "pid", "method", "text", "error", "trace",
        "trace_error"}``."""
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
            trace_error=None if data.get("trace_error") is None else str(data["trace_error"]),
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


def dump_stacks(
    ranks: Mapping[int, int],
    node_dir: Path,
    timeout: float = 10.0,
    trace_wait: float = TRACE_WAIT,
) -> list[StackDump]:
    """Dump every rank of ``ranks`` (rank -> pid) at once; keep each in ``hang_file``.

    The ranks are asked for their flight recorder dumps first, which are then
    waited for at most ``trace_wait`` seconds from the request. Returns the dumps
    in rank order. A dump that cannot be written to the node still comes back (its
    ``error`` says why the file is missing).
    """
    node_dir = Path(node_dir)
    items = sorted(ranks.items())
    if not items:
        return []
    request = request_traces([rank for rank, _ in items], node_dir)
    with ThreadPoolExecutor(max_workers=min(len(items), 16)) as pool:
        dumps = list(pool.map(lambda item: dump_stack(item[1], item[0], node_dir, timeout), items))
    traces, trace_errors = gather_traces(request, trace_wait)
    for dump in dumps:
        dump.trace = traces.get(dump.rank)
        dump.trace_error = trace_errors.get(dump.rank)
    for dump in dumps:
        target = hang_file(node_dir, dump.rank)
        try:
            private_dir(target.parent)
            write_private(target, dump.render())
        except OSError as exc:
            note = f"not kept on the node: {exc}"
            dump.error = f"{dump.error}; {note}" if dump.error else note
    return dumps


@dataclass
class TraceRequest:
    """The flight recorder dumps asked for: the node's flight ``folder`` (None: the
    recorder is off), when (``time.time()`` and ``time.monotonic()``), and through
    what each rank was asked: ``corral`` (the rank wrapper's FIFO), ``nccl``
    (ProcessGroupNCCL's pipe) or ``none`` (nothing answers)."""

    folder: Path | None
    asked: dict[int, str]
    wall: float
    started: float


def _poke(path: Path) -> bool:
    """Write a request to the FIFO ``path``; False when nothing reads it."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_NONBLOCK)
    except OSError:
        return False
    try:
        os.write(fd, b"1\n")
        return True
    except OSError:
        return False
    finally:
        os.close(fd)


def request_traces(ranks: Sequence[int], node_dir: Path) -> TraceRequest:
    """Ask each rank for its flight recorder dump (the wrapper's FIFO, else NCCL's pipe)."""
    folder = Path(node_dir) / FOLDER
    wall, started = time.time(), time.monotonic()
    if not folder.is_dir():
        return TraceRequest(None, {rank: "none" for rank in ranks}, wall, started)
    asked: dict[int, str] = {}
    for rank in ranks:
        if _poke(request_file(folder, rank)):
            asked[rank] = "corral"
        elif _poke(nccl_pipe(folder, rank)):
            asked[rank] = "nccl"
        else:
            asked[rank] = "none"
    return TraceRequest(folder, asked, wall, started)


def _whole(data: bytes) -> bool:
    """Whether ``data`` is a complete dump (torch's pickle, or its JSON form): a file
    still being written is not. Nothing is unpickled: the opcodes are only walked."""
    if data[:1] == b"{":
        try:
            json.loads(data)
        except ValueError:
            return False
        return True
    try:
        for opcode, _arg, pos in pickletools.genops(data):
            if opcode.name == "STOP":
                return pos == len(data) - 1
    except Exception:  # truncated or not a pickle
        return False
    return False


def _read(path: Path, since: float | None) -> bytes | None:
    """The file's content when it exists, is newer than ``since`` (None: any age) and
    is whole; else None."""
    try:
        if since is not None and path.stat().st_mtime < since - 1.0:
            return None
        data = path.read_bytes()
    except OSError:
        return None
    return data if data and _whole(data) else None


def _answer(folder: Path, rank: int, via: str, since: float | None) -> bytes | str | None:
    """Rank ``rank``'s answer: the dump, why there is none (a string), or None (not yet)."""
    if via == "corral":
        try:
            if since is None or error_file(folder, rank).stat().st_mtime >= since - 1.0:
                return error_file(folder, rank).read_text(errors="replace").strip() or "no dump"
        except OSError:
            pass
        return _read(dump_file(folder, rank), since)
    return _read(nccl_dump_file(folder, rank), since)


def gather_traces(
    request: TraceRequest, wait: float = TRACE_WAIT
) -> tuple[dict[int, str], dict[int, str]]:
    """Wait (at most ``wait`` seconds from the request) for every asked rank's whole
    dump; ``({rank: dump in base64}, {rank: why there is none})``.

    A rank nothing could ask still gives a dump NCCL's watchdog wrote on its timeout.
    Dumps over :data:`TRACE_LIMIT` bytes stay on the node."""
    folder = request.folder
    if folder is None:
        why = f"the flight recorder is off on this node ({FLIGHT_RECORDER_OFF})"
        return {}, {rank: why for rank in request.asked}
    answers: dict[int, bytes | str] = {}
    pending = {rank: via for rank, via in request.asked.items() if via != "none"}
    deadline = request.started + wait
    while pending:
        for rank, via in list(pending.items()):
            answer = _answer(folder, rank, via, request.wall)
            if answer is not None:
                answers[rank] = answer
                del pending[rank]
        if not pending or time.monotonic() >= deadline:
            break
        time.sleep(_POLL * 5)
    traces: dict[int, str] = {}
    errors: dict[int, str] = {}
    for rank, via in request.asked.items():
        answer = answers.get(rank)
        if answer is None:  # an older whole dump (NCCL's on its timeout), if any
            answer = _read(dump_file(folder, rank), None) or _read(
                nccl_dump_file(folder, rank), None
            )
        if isinstance(answer, str):
            errors[rank] = f"rank {rank}: {answer}"
        elif answer is None and via == "none":
            errors[rank] = (
                f"rank {rank} answers no dump request (not run by corral's rank wrapper,"
                " no NCCL dump pipe) and left no dump"
            )
        elif answer is None:
            errors[rank] = (
                f"no flight recorder dump from rank {rank} within {wait:g} s of the request"
                f" (a longer wait: --env {TRACE_WAIT_ENV}=S)"
            )
        elif len(answer) > TRACE_LIMIT:
            errors[rank] = (
                f"rank {rank}'s dump is {len(answer)} bytes, over the {TRACE_LIMIT} sent to"
                f" the coordinator; it is in {folder} on the node"
            )
        else:
            traces[rank] = base64.b64encode(answer).decode("ascii")
    return traces, errors


def collect_traces(
    ranks: list[int], node_dir: Path, wait: float = TRACE_WAIT
) -> tuple[dict[int, str], dict[int, str]]:
    """Ask every rank of ``ranks`` for its flight recorder dump and wait for them
    (:func:`request_traces` then :func:`gather_traces`)."""
    return gather_traces(request_traces(ranks, node_dir), wait)


async def dump_event(
    ranks: Mapping[int, int],
    node_dir: Path,
    timeout: float = 10.0,
    trace_wait: float = TRACE_WAIT,
) -> dict[str, Any]:
    """The fields of the agent's ``stacks`` event: ``{"stacks": [StackDump.to_json(), ...]}``.

    Runs :func:`dump_stacks` in a thread. Texts longer than
    :data:`EVENT_TEXT_LIMIT` are cut with a note, keeping the part with the main
    thread (the end of a faulthandler dump, the start of a py-spy one); the
    node's files keep them whole. Flight recorder dumps that would make the event
    larger than :data:`TRACES_PER_EVENT` stay on the node (``trace_error`` says so).
    """
    dumps = await asyncio.to_thread(dump_stacks, dict(ranks), Path(node_dir), timeout, trace_wait)
    stacks = []
    budget = TRACES_PER_EVENT
    for dump in dumps:
        if dump.trace is not None:
            budget -= len(dump.trace)
            if budget < 0:
                dump.trace_error = (
                    f"rank {dump.rank}'s dump did not fit in the event (the node's dumps"
                    f" together are over {TRACES_PER_EVENT} bytes); it is in"
                    f" {Path(node_dir) / FOLDER} on the node"
                )
                dump.trace = None
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
