"""Parsing rsync's stdout: progress2 lines, itemized changes, the --stats block."""

from __future__ import annotations

import pytest

from corral.sync.rsync_output import RsyncReader, exit_meaning, parse_int

# Captured from rsync 3.x with corral's flags (--info=progress2 --stats --out-format=...).
FIRST = (
    b"created directory ro/t\n@corral-item@ >f+++++++++ 5 a\n\r              5  62%    0.00kB/s"
    b"    0:00:00  \r              5  62%    0.00kB/s    0:00:00 (xfr#1, to-chk=3/4)\n"
    b"@corral-item@ cL+++++++++ 1 link\n@corral-item@ cd+++++++++ 4096 d/\n"
    b"@corral-item@ >f+++++++++ 2 d/b\n\r              7  87%    1.95kB/s    0:00:00 (xfr#2, "
    b"to-chk=0/4)\r              7  87%    1.95kB/s    0:00:00 (xfr#2, to-chk=0/4)\n\n"
    b"Number of files: 4 (reg: 2, dir: 1, link: 1)\nNumber of created files: 4 (reg: 2, dir: 1, "
    b"link: 1)\nNumber of deleted files: 0\nNumber of regular files transferred: 2\n"
    b"Total file size: 8 bytes\nTotal transferred file size: 7 bytes\nLiteral data: 7 bytes\n"
    b"Matched data: 0 bytes\nFile list size: 0\nFile list generation time: 0.001 seconds\n"
    b"File list transfer time: 0.000 seconds\nTotal bytes sent: 209\nTotal bytes received: 87\n\n"
    b"sent 209 bytes  received 87 bytes  592.00 bytes/sec\ntotal size is 8  speedup is 0.03\n"
)
NO_CHANGE = (
    b"\r              0   0%    0.00kB/s    0:00:00 (xfr#0, to-chk=0/2001)\n\n"
    b"Number of files: 2,001 (reg: 2,000, dir: 1)\nNumber of regular files transferred: 0\n"
    b"Total file size: 52,428,800 bytes\nTotal transferred file size: 0 bytes\n"
    b"Total bytes sent: 48,112\nTotal bytes received: 12\n"
)


def feed_all(data: bytes, chunk: int) -> RsyncReader:
    reader = RsyncReader()
    for i in range(0, len(data), chunk):
        reader.feed(data[i : i + chunk])
    reader.close()
    return reader


@pytest.mark.parametrize("chunk", [1, 7, 64, 1 << 16])
def test_first_sync_any_chunking(chunk: int) -> None:
    p = feed_all(FIRST, chunk).progress
    assert p.files_changed == 3  # a, link, d/b (the directory is not a file)
    assert p.changed == ["a", "link", "d/b"]
    assert p.files_transferred == 3
    assert p.bytes == 7 and p.rate == "1.95kB/s"
    assert (p.files_checked, p.files_total) == (4, 4)
    assert p.stats["Number of regular files transferred"] == 2
    assert p.bytes_transferred == 7 and p.bytes_sent == 209


def test_no_change_counts_nothing_and_drops_separators() -> None:
    p = feed_all(NO_CHANGE, 13).progress
    assert p.files_transferred == 0 and p.changed == []
    assert p.files_total == 2001 and p.files_checked == 2001
    assert p.stats["Total file size"] == 52_428_800
    assert p.bytes_sent == 48_112


def test_attribute_only_change_is_not_a_transfer() -> None:
    reader = RsyncReader()
    reader.feed(b"@corral-item@ .f...p..... 10 a.py\n@corral-item@ >f.st...... 11 b.py\n")
    assert reader.progress.changed == ["b.py"]


def test_progress_reports_movement_and_incremental_check() -> None:
    reader = RsyncReader()
    assert not reader.feed(b"\r  1,234,567  45%  12.30MB/s  0:00:01 (xfr#12, ir-chk=88/200)")
    assert reader.progress.bytes == 0  # no line end yet
    assert reader.feed(b"\r")
    p = reader.progress
    assert (p.bytes, p.rate, p.files_checked, p.files_total) == (1_234_567, "12.30MB/s", 112, 200)
    assert not reader.feed(b"sent 209 bytes  received 87 bytes  592.00 bytes/sec\n")


def test_names_are_capped() -> None:
    reader = RsyncReader(keep_names=2)
    reader.feed(b"".join(b"@corral-item@ <f+++++++++ 1 f%d\n" % i for i in range(5)))
    assert reader.progress.files_changed == 5 and len(reader.progress.changed) == 2


def test_parse_int_and_exit_meaning() -> None:
    assert parse_int("1,234,567") == 1234567
    assert parse_int("1.234.567") == 1234567
    assert parse_int("") == 0
    assert exit_meaning(23) == "partial transfer due to error"
    assert "ssh" in exit_meaning(255)
    assert exit_meaning(None) == "did not finish"
    assert exit_meaning(-9) == "killed by signal 9"
    assert exit_meaning(99) == "unknown error"
