"""Where a job's output goes: prefixed lines on the terminal, raw lines in log files.

Lines arrive in whole-line chunks per rank (see :mod:`corral.agent.protocol`),
so a chunk is prefixed with one ``join`` and written with one call: lines are
never split or interleaved, and never dropped. Every rank's output is also
teed to ``<run_dir>/<job>/logs/<host>.<rank>.log`` (node-level output such as
torchrun's own goes to ``<host>.node.log``).

On a terminal, prefixes are colored per host and a live progress line per
node (fed by ``corral.sdk.report``) sits below the log: it is erased before a
chunk of lines is written and redrawn at most four times a second, with
pre-colored bytes so a terminal costs little more than a pipe. When piped,
output is plain and progress is printed as an occasional line.
"""

from __future__ import annotations

import sys
import threading
import time
from collections import deque
from collections.abc import Mapping
from pathlib import Path
from typing import IO, Any

from rich.console import Console
from rich.text import Text

NODE_RANK_LABEL = -1
# ANSI foreground colors per host: cyan, magenta, green, yellow, blue, then bright ones
_ANSI = (36, 35, 32, 33, 34, 96, 95, 92, 93, 94, 91)
_RESET = b"\x1b[0m"
_FOOTER_INTERVAL = 0.25
_PLAIN_PROGRESS_INTERVAL = 10.0


class StreamWriterThread:
    """Writes to the terminal or pipe from a thread of its own.

    A slow reader (a paused terminal, ``| less``) must not stall the event loop:
    the supervisor keeps reading agents and sending heartbeats while output
    waits here, in order. Only past ``cap`` bytes in waiting does ``write``
    block (back-pressure instead of unbounded memory). Once the reader is gone
    (``| head``), output is discarded; the log files still get every line.
    """

    def __init__(self, stream: IO[bytes], cap: int = 64 << 20) -> None:
        self.stream = stream
        self.cap = cap
        self._chunks: deque[bytes] = deque()
        self._queued = 0
        self._closed = False
        self.broken = False
        self._cond = threading.Condition()
        self._thread = threading.Thread(target=self._run, name="corral-output", daemon=True)
        self._thread.start()

    def write(self, data: bytes) -> None:
        """Queue ``data``; blocks only while more than ``cap`` bytes are waiting."""
        with self._cond:
            while self._queued > self.cap and not self.broken:
                self._cond.wait()
            self._chunks.append(data)
            self._queued += len(data)
            self._cond.notify_all()

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._chunks and not self._closed:
                    self._cond.wait()
                if not self._chunks:
                    return
                data = b"".join(self._chunks)
                self._chunks.clear()
            if not self.broken:
                try:
                    self.stream.write(data)
                    self.stream.flush()
                except (BrokenPipeError, OSError, ValueError):
                    self.broken = True
            with self._cond:
                self._queued -= len(data)
                self._cond.notify_all()

    def close(self) -> None:
        """Write out everything queued, then stop the thread."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()
        self._thread.join()


def say(console: Console, text: str, style: str = "bold") -> None:
    """One line of corral's own outside a job's log stream (never read as markup)."""
    console.print(Text("[corral] ", style=style) + Text(text), soft_wrap=True)


def prefix_for(host: str, rank: int) -> str:
    """The ``[host:rank]`` prefix (``[host]`` for node-level output)."""
    return f"[{host}]" if rank == NODE_RANK_LABEL else f"[{host}:{rank}]"


def format_progress(progress: Mapping[str, Any]) -> str:
    """``step 20/60 loss=0.5312`` from a report event."""
    step = progress.get("step")
    total = progress.get("total")
    text = f"step {step}" + (f"/{total}" if total else "")
    metrics = progress.get("metrics") or {}
    for key, value in metrics.items():
        text += f" {key}={value:.4g}" if isinstance(value, float) else f" {key}={value}"
    return text


class LogSink:
    """Prefixes, colors and tees every rank's output; shows progress."""

    def __init__(
        self,
        log_dir: Path,
        hosts: list[str],
        *,
        stream: IO[bytes] | None = None,
        live: bool | None = None,
        console: Console | None = None,
    ) -> None:
        self.log_dir = log_dir
        log_dir.mkdir(parents=True, exist_ok=True)
        self.stream = stream if stream is not None else sys.stdout.buffer
        if live is None:
            live = sys.stdout.isatty() and sys.stderr.isatty() and stream is None
        self.live_mode = live
        self.console = console or Console(stderr=not live, highlight=False)
        self._colors = {h: _ANSI[i % len(_ANSI)] for i, h in enumerate(hosts)}
        self._hosts = hosts
        self._files: dict[tuple[str, int], IO[bytes]] = {}
        self._prefixes: dict[tuple[str, int], bytes] = {}
        self.progress: dict[str, dict[str, Any]] = {}
        self._last_plain_progress = time.monotonic()
        self._footer_height = 0
        self._footer_drawn_at = 0.0
        self._writer = StreamWriterThread(self.stream)

    # -- log lines ----------------------------------------------------------------------

    def log_path(self, host: str, rank: int) -> Path:
        """The coordinator-side log file of one rank (or the node's own output)."""
        name = f"{host}.node.log" if rank == NODE_RANK_LABEL else f"{host}.{rank}.log"
        return self.log_dir / name

    def _file(self, host: str, rank: int) -> IO[bytes]:
        key = (host, rank)
        handle = self._files.get(key)
        if handle is None:
            handle = self._files[key] = open(self.log_path(host, rank), "ab")  # noqa: SIM115
        return handle

    def _prefix(self, host: str, rank: int) -> bytes:
        key = (host, rank)
        prefix = self._prefixes.get(key)
        if prefix is None:
            prefix = (prefix_for(host, rank) + " ").encode()
            if self.live_mode:
                prefix = b"\x1b[%dm" % self._colors.get(host, 37) + prefix + _RESET
            self._prefixes[key] = prefix
        return prefix

    def lines(self, host: str, rank: int, data: bytes) -> None:
        """Write a chunk of whole lines (ending in a newline) from one rank."""
        self._file(host, rank).write(data)
        prefix = self._prefix(host, rank)
        body = data[:-1] if data.endswith(b"\n") else data
        text = prefix + body.replace(b"\n", b"\n" + prefix) + b"\n"
        if self.live_mode:
            self._write_above_footer(text)
        else:
            self._write(text)

    def _write(self, data: bytes) -> None:
        """Hand bytes to the writer thread (in order; never dropped)."""
        self._writer.write(data)

    def message(self, text: str, style: str = "bold") -> None:
        """One line of corral's own (status, warnings)."""
        if self.live_mode:
            with self.console.capture() as captured:
                self.console.print(Text("[corral] ", style=style) + Text(text), soft_wrap=True)
            self._write_above_footer(captured.get().encode())
            return
        say(self.console, text, style)

    # -- the live footer (terminal only) -----------------------------------------------

    def _erase_footer(self) -> bytes:
        if not self._footer_height:
            return b""
        height, self._footer_height = self._footer_height, 0
        return b"\x1b[%dF\x1b[J" % height  # up to the footer's first line, clear below

    def _footer(self) -> bytes:
        lines = []
        for host in self._hosts:
            prog = self.progress.get(host)
            text = format_progress(prog) if prog else "waiting for first report"
            color = self._colors.get(host, 37)
            lines.append(b"\x1b[%dm%12s\x1b[0m %s\n" % (color, host.encode(), text.encode()))
        self._footer_height = len(lines)
        self._footer_drawn_at = time.monotonic()
        return b"".join(lines)

    def _write_above_footer(self, text: bytes, *, force: bool = False) -> None:
        out = self._erase_footer() + text
        if self.progress and (
            force or time.monotonic() - self._footer_drawn_at >= _FOOTER_INTERVAL
        ):
            out += self._footer()
        self._write(out)

    # -- progress -------------------------------------------------------------------------

    def report(self, host: str, event: Mapping[str, Any]) -> None:
        """Record a progress report of a rank on ``host`` (the lowest rank per node wins)."""
        current = self.progress.get(host)
        if current is not None and event.get("rank", 0) > current.get("rank", 0):
            return
        self.progress[host] = dict(event)
        if self.live_mode:
            if time.monotonic() - self._footer_drawn_at >= _FOOTER_INTERVAL:
                self._write_above_footer(b"", force=True)
        elif time.monotonic() - self._last_plain_progress >= _PLAIN_PROGRESS_INTERVAL:
            self._print_plain_progress()

    def _print_plain_progress(self) -> None:
        self._last_plain_progress = time.monotonic()
        parts = [f"{h}: {format_progress(p)}" for h, p in self.progress.items()]
        self.message("progress  " + " | ".join(parts), style="dim")

    def close(self) -> None:
        """Erase the live footer and close every log file."""
        if self._footer_height:
            self._write(self._erase_footer())
        self._writer.close()  # waits until everything queued is written
        for handle in self._files.values():
            handle.close()
        self._files.clear()
