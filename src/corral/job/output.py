"""The terminal subscriber: a job's events as prefixed lines, messages and progress.

``corral run`` subscribes a :class:`TerminalOutput` to its job (the log files are
written by the engine, whatever subscribes). Lines arrive in whole-line chunks
per rank (see :mod:`corral.agent.protocol`), so a chunk is prefixed with one
``join`` and written with one call: lines are never split or interleaved, and
never dropped.

On a terminal, prefixes are colored per host and a live progress line per
node (fed by ``corral.sdk.report``, or by a rank's latest ``\r`` progress-bar
update) sits below the log: it is erased before a chunk of lines is written and
redrawn at most four times a second, with pre-colored bytes so a terminal costs
little more than a pipe. When piped, output is plain and progress is printed as
an occasional line.

Once corral stops a job, the launchers' own teardown noise (torchrun's
``SignalException`` traceback on SIGTERM) is not shown: it is counted and folded
into one line per node (the log files keep it). So is a node's own output once
all its ranks have exited (torchrun's ``TCPStore recvVector failed`` stack at the
end of a job that succeeded). Every log view folds the same way
(:class:`corral.job.fold.TeardownFold`).

Off a terminal nothing is wrapped (see :func:`corral.console.make_console`).
"""

from __future__ import annotations

import sys
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping
from typing import IO, Any

from rich.console import Console
from rich.text import Text

from corral.console import make_console
from corral.job.events import (
    AttemptStarted,
    Checked,
    Finished,
    JobEvent,
    Level,
    LogLines,
    Message,
    Progress,
    StragglerFound,
    fields_of,
)
from corral.job.fold import TeardownFold
from corral.job.logfiles import NODE_RANK_LABEL
from corral.words import plural

STYLES: dict[str, str] = {
    "info": "bold",
    "success": "green",
    "warning": "yellow",
    "error": "bold red",
    "detail": "dim",
    "output": "",
}
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


def _latest_segment(text: bytes) -> bytes:
    """What a terminal shows of a line with ``\r`` updates: its last non-empty segment."""
    for segment in reversed(text.split(b"\r")):
        if segment.strip():
            return segment
    return b""


class TerminalOutput:
    """Prefixes and colors every rank's output, shows progress and corral's messages;
    at the end prints the summary (a :class:`~corral.job.events.Subscriber`)."""

    def __init__(
        self,
        hosts: list[str] | None = None,
        *,
        stream: IO[bytes] | None = None,
        live: bool | None = None,
        console: Console | None = None,
        on_finish: Callable[[Finished, Console], None] | None = None,
        on_checked: Callable[[Checked, Console], None] | None = None,
    ) -> None:
        self.stream = stream if stream is not None else sys.stdout.buffer
        if live is None:
            live = sys.stdout.isatty() and sys.stderr.isatty() and stream is None
        self.live_mode = live
        self.console = console or make_console(stderr=not live)
        self._hosts: list[str] = []
        self._colors: dict[str, int] = {}
        for host in hosts or []:
            self._add_host(host)
        self._prefixes: dict[tuple[str, int], bytes] = {}
        self.progress: dict[str, dict[str, Any]] = {}
        self.bars: dict[tuple[str, int], str] = {}  # a rank's latest \r update
        self._partial: dict[tuple[str, int], bytes] = {}
        self._last_plain_progress = time.monotonic()
        self._footer_height = 0
        self._footer_drawn_at = 0.0
        self.fold = TeardownFold()  # node-level lines hidden during a teardown
        self._on_finish = on_finish
        self._on_checked = on_checked
        self.stragglers: dict[tuple[str, int, str], StragglerFound] = {}  # for the summary
        self._writer = StreamWriterThread(self.stream)

    def _add_host(self, host: str) -> None:
        if host not in self._colors:
            self._colors[host] = _ANSI[len(self._hosts) % len(_ANSI)]
            self._hosts.append(host)

    # -- events ---------------------------------------------------------------------------

    def on_event(self, event: JobEvent) -> None:
        """Render one job event."""
        if self.fold.see(event):
            return
        if self.fold.ended:
            self._flush_folded()
        if isinstance(event, LogLines):
            self.lines(event.host, event.rank, event.data)
        elif isinstance(event, Progress):
            self.report(event.host, fields_of(event))
        elif isinstance(event, Message):
            self.message(event.text, event.level)
        elif isinstance(event, StragglerFound):
            self.stragglers[(event.host, event.rank, event.section)] = event
            self.message(event.text, "warning")
        elif isinstance(event, AttemptStarted):
            for host in event.hosts:
                self._add_host(host)
            attempt = f" (attempt {event.number})" if event.number else ""
            self.message(
                f"job {event.job_id}{attempt}: {plural(len(event.hosts), 'node')}, "
                f"{plural(event.world_size, 'rank')}, launcher {event.launcher}; logs in "
                f"{event.log_dir}"
            )
        elif isinstance(event, Checked) and self._on_checked is not None:
            self._print_outside(lambda: self._on_checked(event, self.console))  # type: ignore[misc]
        elif isinstance(event, Finished):
            self.close()
            if self._on_finish is not None:
                self._on_finish(event, self.console)
            if self.stragglers:
                named = [
                    f"rank {s.rank} on {s.host} ({s.section} {s.ratio:.1f}x "
                    f"{'the median' if s.basis == 'median' else 'its own best'})"
                    for s in self.stragglers.values()
                ]
                say(self.console, "stragglers: " + ", ".join(named), "yellow")

    def _flush_folded(self) -> None:
        for note in self.fold.flush():
            self.message(note, "detail")

    def _print_outside(self, render: Callable[[], None]) -> None:
        """Print something of the console's own (a table) below the log."""
        if self._footer_height:
            self._write(self._erase_footer())
        render()

    # -- log lines ----------------------------------------------------------------------

    def _prefix(self, host: str, rank: int) -> bytes:
        key = (host, rank)
        prefix = self._prefixes.get(key)
        if prefix is None:
            self._add_host(host)
            prefix = (prefix_for(host, rank) + " ").encode()
            if self.live_mode:
                prefix = b"\x1b[%dm" % self._colors.get(host, 37) + prefix + _RESET
            self._prefixes[key] = prefix
        return prefix

    def lines(self, host: str, rank: int, data: bytes) -> None:
        """Show a chunk of one rank's output: whole lines, prefixed; a trailing
        ``\r`` update becomes the rank's live status (shown once its line ends)."""
        key = (host, rank)
        pending = self._partial.pop(key, b"")
        if pending:
            data = pending + data
        cut = data.rfind(b"\n") + 1
        whole, rest = data[:cut], data[cut:]
        if whole:
            self.bars.pop(key, None)
            body = whole[:-1]
            if b"\r" in body:
                body = b"\n".join(_latest_segment(line) for line in body.split(b"\n"))
            prefix = self._prefix(host, rank)
            text = prefix + body.replace(b"\n", b"\n" + prefix) + b"\n"
            if self.live_mode:
                self._write_above_footer(text)
            else:
                self._write(text)
        if rest:  # a progress bar's \r update, not a line yet
            self._partial[key] = rest[-4096:]
            status = _latest_segment(rest).decode("utf-8", "replace").strip()
            if status:
                self.bars[key] = status
                self._status_changed()

    def _write(self, data: bytes) -> None:
        """Hand bytes to the writer thread (in order; never dropped)."""
        self._writer.write(data)

    def message(self, text: str, level: Level | str = "info") -> None:
        """One line of corral's own (status, warnings)."""
        style = STYLES.get(level, level)
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

    def _status(self, host: str) -> str:
        prog = self.progress.get(host)
        if prog:
            return format_progress(prog)
        bars = [text for (h, _), text in sorted(self.bars.items()) if h == host]
        return bars[0] if bars else "waiting for first report"

    def _footer(self) -> bytes:
        lines = []
        for host in self._hosts:
            color = self._colors.get(host, 37)
            text = self._status(host).encode()
            lines.append(b"\x1b[%dm%12s\x1b[0m %s\n" % (color, host.encode(), text))
        self._footer_height = len(lines)
        self._footer_drawn_at = time.monotonic()
        return b"".join(lines)

    def _write_above_footer(self, text: bytes, *, force: bool = False) -> None:
        out = self._erase_footer() + text
        if (self.progress or self.bars) and (
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
        self._status_changed()

    def _status_changed(self) -> None:
        if self.live_mode:
            if time.monotonic() - self._footer_drawn_at >= _FOOTER_INTERVAL:
                self._write_above_footer(b"", force=True)
        elif time.monotonic() - self._last_plain_progress >= _PLAIN_PROGRESS_INTERVAL:
            self._print_plain_progress()

    def _print_plain_progress(self) -> None:
        self._last_plain_progress = time.monotonic()
        parts = [f"{h}: {self._status(h)}" for h in self._hosts if h in self.progress]
        parts += [
            f"{prefix_for(h, r)} {text}"
            for (h, r), text in sorted(self.bars.items())
            if h not in self.progress
        ]
        self.message("progress  " + " | ".join(parts), "detail")

    def close(self) -> None:
        """Show what is still pending, erase the live footer, flush the output."""
        for (host, rank), rest in list(self._partial.items()):
            self._partial.pop((host, rank))
            self.lines(host, rank, rest + b"\n")
        self._flush_folded()
        if self._footer_height:
            self._write(self._erase_footer())
        self._writer.close()  # waits until everything queued is written
