"""Where a job's output goes: prefixed lines on the terminal, raw lines in log files.

Lines arrive in whole-line chunks per rank (see :mod:`corral.agent.protocol`),
so a chunk is prefixed with one ``join`` and written with one call: lines are
never split or interleaved, and never dropped. Every rank's output is also
teed to ``<run_dir>/<job>/logs/<host>.<rank>.log`` (node-level output such as
torchrun's own goes to ``<host>.node.log``).

On a terminal, prefixes are colored per host and a live progress line per
node (fed by ``corral.sdk.report``) sits below the log; when piped, output is
plain and progress is printed as an occasional line.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import IO, Any

from rich.console import Console, Group
from rich.live import Live
from rich.text import Text

NODE_RANK_LABEL = -1
_COLORS = (
    "cyan",
    "magenta",
    "green",
    "yellow",
    "blue",
    "bright_red",
    "bright_cyan",
    "bright_magenta",
    "bright_green",
    "bright_yellow",
    "bright_blue",
)
_PLAIN_PROGRESS_INTERVAL = 10.0


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
        self._colors = {h: _COLORS[i % len(_COLORS)] for i, h in enumerate(hosts)}
        self._hosts = hosts
        self._files: dict[tuple[str, int], IO[bytes]] = {}
        self._prefixes: dict[tuple[str, int], bytes] = {}
        self.progress: dict[str, dict[str, Any]] = {}
        self._last_plain_progress = time.monotonic()
        self._progress_dirty = False
        self._live: Live | None = None
        if live:
            self._live = Live(
                self._render_progress(),
                console=self.console,
                auto_refresh=True,
                refresh_per_second=4,
                transient=True,
            )
            self._live.start()

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
            prefix = self._prefixes[key] = (prefix_for(host, rank) + " ").encode()
        return prefix

    def lines(self, host: str, rank: int, data: bytes) -> None:
        """Write a chunk of whole lines (ending in a newline) from one rank."""
        self._file(host, rank).write(data)
        if self._live is not None:
            self._print_live(host, rank, data)
            return
        prefix = self._prefix(host, rank)
        body = data[:-1] if data.endswith(b"\n") else data
        self.stream.write(prefix + body.replace(b"\n", b"\n" + prefix) + b"\n")
        self.stream.flush()

    def _print_live(self, host: str, rank: int, data: bytes) -> None:
        text = Text(no_wrap=False, end="")
        label = prefix_for(host, rank) + " "
        style = self._colors.get(host, "white")
        for line in data.decode("utf-8", "replace").splitlines():
            text.append(label, style=style)
            text.append(line + "\n")
        self.console.print(text, end="", soft_wrap=True)

    def message(self, text: str, style: str = "bold") -> None:
        """One line of corral's own (status, warnings)."""
        self.console.print(Text("[corral] ", style=style) + Text(text), soft_wrap=True)

    # -- progress -------------------------------------------------------------------------

    def report(self, host: str, event: Mapping[str, Any]) -> None:
        """Record a progress report of a rank on ``host`` (the lowest rank per node wins)."""
        current = self.progress.get(host)
        if current is not None and event.get("rank", 0) > current.get("rank", 0):
            return
        self.progress[host] = dict(event)
        self._progress_dirty = True
        if self._live is not None:
            self._live.update(self._render_progress())
        elif time.monotonic() - self._last_plain_progress >= _PLAIN_PROGRESS_INTERVAL:
            self._print_plain_progress()

    def _print_plain_progress(self) -> None:
        self._last_plain_progress = time.monotonic()
        self._progress_dirty = False
        parts = [f"{h}: {format_progress(p)}" for h, p in self.progress.items()]
        self.message("progress  " + " | ".join(parts), style="dim")

    def _render_progress(self) -> Group:
        rows = []
        for host in self._hosts:
            prog = self.progress.get(host)
            text = Text(f"{host:>12} ", style=self._colors.get(host, "white"))
            text.append(format_progress(prog) if prog else "waiting for first report")
            rows.append(text)
        return Group(*rows)

    def close(self) -> None:
        """Stop the live display and close every log file."""
        if self._live is not None:
            self._live.stop()
            self._live = None
        for handle in self._files.values():
            handle.close()
        self._files.clear()
        self.stream.flush()
