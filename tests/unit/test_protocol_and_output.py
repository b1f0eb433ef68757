"""Agent frames, the terminal output's prefixing and the coordinator's log files."""

from __future__ import annotations

import asyncio
import io
import json
from pathlib import Path

import pytest
from rich.console import Console

from corral.agent.protocol import (
    EVENT,
    NODE,
    STDERR,
    STDOUT,
    decode_header,
    encode_event,
    encode_frame,
    read_frame,
)
from corral.job.logfiles import LogFiles
from corral.job.output import TerminalOutput, format_progress


class LogSink:
    """What the supervisor does with a chunk: the log file, then the terminal."""

    def __init__(self, log_dir: Path, hosts: list[str], **kw: object) -> None:
        self.files = LogFiles(log_dir)
        self.out = TerminalOutput(hosts, **kw)  # type: ignore[arg-type]

    def lines(self, host: str, rank: int, data: bytes) -> None:
        self.files.write(host, rank, data)
        self.out.lines(host, rank, data)

    def report(self, host: str, event: dict[str, object]) -> None:
        self.out.report(host, event)

    def close(self) -> None:
        self.out.close()
        self.files.close()


def test_frame_roundtrip() -> None:
    frame = encode_frame(STDERR, 12, b"a\nb\n")
    header, payload = frame.split(b"\n", 1)
    assert decode_header(header + b"\n") == (STDERR, 12, 4)
    assert payload == b"a\nb\n"
    event = encode_event({"event": "x", "n": 1})
    header, payload = event.split(b"\n", 1)
    kind, rank, length = decode_header(header)
    assert (kind, rank) == (EVENT, NODE) and json.loads(payload[:length]) == {"event": "x", "n": 1}


@pytest.mark.parametrize("bad", [b"x 1 2\n", b"o 1\n", b"o a 2\n", b"o 1 -5\n", b""])
def test_bad_headers(bad: bytes) -> None:
    with pytest.raises(ValueError):
        decode_header(bad)


def test_sink_prefixes_each_line_and_tees(tmp_path: Path) -> None:
    out = io.BytesIO()
    sink = LogSink(
        tmp_path, ["h1", "h2"], stream=out, live=False, console=Console(file=io.StringIO())
    )
    sink.lines("h1", 0, b"one\ntwo\n")
    sink.lines("h2", 3, b"three\n")
    sink.lines("h2", NODE, b"node says\n")
    sink.close()
    assert out.getvalue() == b"[h1:0] one\n[h1:0] two\n[h2:3] three\n[h2] node says\n"
    assert (tmp_path / "h1.0.log").read_bytes() == b"one\ntwo\n"
    assert (tmp_path / "h2.3.log").read_bytes() == b"three\n"
    assert (tmp_path / "h2.node.log").read_bytes() == b"node says\n"


def test_progress_format() -> None:
    assert format_progress({"step": 3, "total": 10, "metrics": {"loss": 0.123456}}) == (
        "step 3/10 loss=0.1235"
    )
    assert format_progress({"step": 3, "total": None, "metrics": {}}) == "step 3"


def test_live_mode_colors_prefixes_and_keeps_a_progress_footer(tmp_path: Path) -> None:
    out = io.BytesIO()
    sink = LogSink(
        tmp_path,
        ["h1", "h2"],
        stream=out,
        live=True,
        console=Console(file=io.StringIO(), force_terminal=True),
    )
    sink.report("h1", {"rank": 0, "step": 5, "total": 10, "metrics": {"loss": 0.5}})
    sink.lines("h2", 1, b"hello\n")
    sink.close()
    text = out.getvalue()
    assert b"step 5/10 loss=0.5" in text  # the footer was drawn, then erased above it:
    assert b"\x1b[2F\x1b[J\x1b[35m[h2:1] \x1b[0mhello\n" in text  # h2's color, whole line
    assert text.endswith(b"hello\n")  # within 0.25 s: no redraw, nothing left to erase
    assert (tmp_path / "h2.1.log").read_bytes() == b"hello\n"  # logs stay plain


class _ClosedPipe(io.BytesIO):
    def write(self, data: bytes) -> int:  # type: ignore[override]
        raise BrokenPipeError


def test_sink_keeps_logging_when_stdout_is_gone(tmp_path: Path) -> None:
    sink = LogSink(
        tmp_path, ["h1"], stream=_ClosedPipe(), live=False, console=Console(file=io.StringIO())
    )
    sink.lines("h1", 0, b"one\n")  # `corral run ... | head` closed the pipe
    sink.lines("h1", 0, b"two\n")
    sink.close()
    assert (tmp_path / "h1.0.log").read_bytes() == b"one\ntwo\n"


def test_rank_exit_status_is_what_the_os_reports() -> None:
    from corral.agent.worker import _exit_code

    assert _exit_code(SystemExit(None)) == 0
    assert _exit_code(SystemExit(7)) == 7
    assert _exit_code(SystemExit(-1)) == 255
    assert _exit_code(SystemExit(256)) == 0


def test_read_frame_reads_whole_frames_and_says_where_the_stream_breaks() -> None:
    async def frames(data: bytes) -> list[object]:
        reader = asyncio.StreamReader()
        reader.feed_data(data)
        reader.feed_eof()
        out: list[object] = []
        try:
            while (frame := await read_frame(reader)) is not None:
                out.append(frame)
        except (ValueError, asyncio.IncompleteReadError) as exc:
            out.append(type(exc).__name__)
        return out

    two = encode_event({"event": "hb", "time": 1.0}) + encode_frame(STDOUT, 3, b"hi\n")
    assert asyncio.run(frames(two)) == [
        (EVENT, NODE, b'{"event":"hb","time":1.0}'),
        (STDOUT, 3, b"hi\n"),
    ]
    assert asyncio.run(frames(b"Welcome to the login shell\n")) == ["ValueError"]
    assert asyncio.run(frames(encode_frame(STDOUT, 0, b"abcdef")[:-2])) == ["IncompleteReadError"]
