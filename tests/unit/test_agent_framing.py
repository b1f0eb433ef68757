"""Cutting rank output into frames: whole lines at once, ``\\r`` progress at most
every 0.2 s, the rest at EOF (corral.agent.protocol.Framer)."""

from __future__ import annotations

import pytest

from corral.agent.protocol import CR_INTERVAL, Framer, decode_op, frame_payload


class Clock:
    """A hand-driven monotonic clock."""

    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock() -> Clock:
    return Clock()


def test_whole_lines_go_at_once_and_partial_lines_wait(clock: Clock) -> None:
    framer = Framer(clock=clock)
    assert framer.feed(b"one\ntw") == b"one\n"
    assert framer.feed(b"o") == b""
    assert framer.due() is None
    assert framer.feed(b"\nthree\nfo") == b"two\nthree\n"
    assert framer.close() == b"fo"
    assert framer.close() == b""


def test_carriage_return_output_is_flushed_at_most_every_interval(clock: Clock) -> None:
    framer = Framer(clock=clock)
    # the first \r update of a stream goes at once, up to and including its last \r
    assert framer.feed(b"  0%|   |\r 10%|") == b"  0%|   |\r"
    clock.now += 0.05
    assert framer.feed(b"#  |\r 20%|") == b""  # too soon: it waits
    assert framer.due() == pytest.approx(100.0 + CR_INTERVAL)
    assert framer.poll() == b""
    clock.now = 100.0 + CR_INTERVAL
    assert framer.poll() == b" 10%|#  |\r"
    assert framer.due() is None  # " 20%|" has no \r after it yet
    assert framer.poll() == b""
    clock.now += 1.0
    assert framer.feed(b"## |\r") == b" 20%|## |\r"


def test_a_newline_flushes_at_once_including_later_carriage_returns(clock: Clock) -> None:
    framer = Framer(clock=clock)
    assert framer.feed(b"a\r") == b"a\r"
    clock.now += 0.01
    assert framer.feed(b"b\r") == b""  # waits for its turn
    assert framer.feed(b"c\nd\re") == b"b\rc\nd\r"  # a newline does not wait
    assert framer.close() == b"e"


def test_long_lines_are_cut_into_pieces(clock: Clock) -> None:
    framer = Framer(max_line=8, clock=clock)
    assert framer.feed(b"abcd") == b""
    assert framer.feed(b"efghij") == b"abcdefghij"
    assert framer.feed(b"k\n") == b"k\n"


def test_chunks_reassemble_the_stream_exactly(clock: Clock) -> None:
    data = b"epoch 1\n" + b"".join(b"\r%3d%%|" % i for i in range(50)) + b"\ndone\r\nend"
    framer = Framer(max_line=64, clock=clock)
    chunks = []
    for i in range(0, len(data), 7):
        clock.now += 0.03
        chunks.append(framer.feed(data[i : i + 7]))
        chunks.append(framer.poll())
    chunks.append(framer.close())
    sent = [c for c in chunks if c]
    assert b"".join(sent) == data  # every byte once, in order
    assert all(c.endswith((b"\n", b"\r")) for c in sent[:-1])
    assert sent[-1] == b"end"
    assert len(sent) < 20  # the 50 bar updates were not sent one by one


def test_frame_payload_always_ends_a_line() -> None:
    assert frame_payload(b"a\n") == b"a\n"
    assert frame_payload(b"50%\r") == b"50%\r"
    assert frame_payload(b"tail") == b"tail\n"


@pytest.mark.parametrize("line", [b"nope\n", b"[1]\n", b'{"op": 3}\n', b'{"grace": 1}\n'])
def test_decode_op_rejects_what_is_not_an_op(line: bytes) -> None:
    with pytest.raises(ValueError, match="not"):
        decode_op(line)


def test_decode_op() -> None:
    assert decode_op(b'{"op":"stop","grace":2}\n') == {"op": "stop", "grace": 2}
