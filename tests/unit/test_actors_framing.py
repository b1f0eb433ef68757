"""Frames on an actor channel: empty and large bodies, partial reads and writes,
EOF mid-frame, bytes that are not frames."""

from __future__ import annotations

import asyncio
import io
import os
import sys
import threading
import types
from dataclasses import dataclass

import pytest

import __main__
from corral.actors import _framing as fr


class Trickle(io.RawIOBase):
    """A stream that hands out at most ``step`` bytes per read (partial reads)."""

    def __init__(self, data: bytes, step: int) -> None:
        self.data = data
        self.pos = 0
        self.step = step

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: bytearray | memoryview) -> int:  # type: ignore[override]
        n = min(self.step, len(buffer), len(self.data) - self.pos)
        buffer[:n] = self.data[self.pos : self.pos + n]
        self.pos += n
        return n


def frame(kind: int, body: bytes) -> bytes:
    return fr.header(kind, len(body)) + body


def test_empty_body_and_clean_eof() -> None:
    stream = Trickle(frame(fr.STOP, b"") + frame(fr.MSG, fr.dumps(None)), step=1)
    assert fr.read_frame(stream) == (fr.STOP, bytearray())
    kind, body = fr.read_frame(stream) or (0, b"")
    assert kind == fr.MSG and fr.loads(body) is None
    assert fr.read_frame(stream) is None


@pytest.mark.parametrize("step", [1, 7, 4096])
def test_partial_reads_give_whole_frames(step: int) -> None:
    values = [b"", "x" * 10_000, {"a": [1, 2, 3]}, list(range(1000))]
    data = b"".join(frame(fr.MSG, fr.dumps(v)) for v in values)
    stream = Trickle(data, step)
    got = []
    while (item := fr.read_frame(stream)) is not None:
        got.append(fr.loads(item[1]))
    assert got == values


def test_eof_mid_frame_is_an_error() -> None:
    whole = frame(fr.MSG, fr.dumps("hello"))
    for cut in (3, fr.HEADER.size, len(whole) - 1):
        with pytest.raises(EOFError):
            fr.read_frame(Trickle(whole[:cut], 2))


def test_bytes_that_are_not_frames_are_refused() -> None:
    with pytest.raises(fr.ProtocolError):
        fr.read_frame(Trickle(b"Welcome to host!\n", 64))  # a chatty login script
    with pytest.raises(fr.ProtocolError):
        fr.parse_header(fr.HEADER.pack(fr.MAX_BODY + 1, fr.MSG))


def test_a_large_frame_through_a_pipe_with_partial_writes() -> None:
    body = os.urandom(1 << 20) * 24  # 24 MiB: many partial pipe writes and reads
    read_fd, write_fd = os.pipe()
    writer = threading.Thread(target=lambda: fr.write_frame(write_fd, fr.MSG, body))
    writer.start()
    with io.FileIO(read_fd, "rb", closefd=True) as reader:
        got = fr.read_frame(reader)
        writer.join()
        os.close(write_fd)
        assert got == (fr.MSG, bytearray(body))
        assert fr.read_frame(reader) is None


def test_async_reader_with_split_feeds() -> None:
    async def main() -> list[tuple[int, bytes] | None]:
        reader = asyncio.StreamReader()
        data = frame(fr.HELLO, fr.encode_json({"pid": 1})) + frame(fr.READY, b"")
        data += frame(fr.MSG, fr.dumps(b"\0" * 100_000))
        for i in range(0, len(data), 999):
            reader.feed_data(data[i : i + 999])
        reader.feed_eof()
        return [await fr.read_frame_async(reader) for _ in range(4)]

    hello, ready, msg, end = asyncio.run(main())
    assert hello is not None and fr.decode_json(hello[1]) == {"pid": 1}
    assert ready == (fr.READY, b"")
    assert msg is not None and fr.loads(msg[1]) == b"\0" * 100_000
    assert end is None


def test_async_reader_eof_mid_frame() -> None:
    async def main() -> None:
        reader = asyncio.StreamReader()
        reader.feed_data(frame(fr.MSG, b"abcdef")[:-2])
        reader.feed_eof()
        await fr.read_frame_async(reader)

    with pytest.raises(asyncio.IncompleteReadError):
        asyncio.run(main())


def test_classes_of_the_workers_main_script_resolve_here(monkeypatch: pytest.MonkeyPatch) -> None:
    """A worker loads the coordinator's script as ``__mp_main__``: its instances
    unpickle here against ``__main__``."""
    worker_main = types.ModuleType("__mp_main__")

    @dataclass
    class Point:
        x: int

    Point.__module__ = "__mp_main__"
    Point.__qualname__ = "Point"
    worker_main.Point = Point  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "__mp_main__", worker_main)
    body = fr.dumps(Point(3))
    monkeypatch.delitem(sys.modules, "__mp_main__")
    monkeypatch.setattr(__main__, "Point", Point, raising=False)
    assert fr.loads(body) == Point(3)
