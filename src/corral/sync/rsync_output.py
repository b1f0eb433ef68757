"""Reading rsync's stdout while it runs: progress, changed files, final stats.

corral runs rsync with ``--info=progress2 --stats --out-format=MARKER%i %l %n``:

* ``--info=progress2`` rewrites one line with ``\\r``:
  ``  1,234,567  45%  12.3MB/s  0:00:01 (xfr#12, to-chk=88/2000)``
  (bytes of file data sent so far; files left to check of the total);
* ``--out-format`` prints one line per changed item: ``MARKER>f+++++++++ 2048 a/b.py``
  (rsync's itemize flags, the file length, the name with odd bytes escaped);
* ``--stats`` ends with ``Key: value`` lines (files transferred, bytes sent, ...).

Numbers may carry thousands separators (``,`` or ``.`` by locale); they are dropped.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

__all__ = [
    "EXIT_CODES",
    "ITEM_MARKER",
    "OUT_FORMAT",
    "RsyncProgress",
    "RsyncReader",
    "exit_meaning",
    "parse_int",
]

ITEM_MARKER = "@corral-item@ "
OUT_FORMAT = ITEM_MARKER + "%i %l %n"

#: rsync's exit codes (``man rsync``, EXIT VALUES), plus 255 from ssh.
EXIT_CODES: dict[int, str] = {
    1: "syntax or usage error",
    2: "protocol incompatibility",
    3: "errors selecting input/output files or dirs",
    4: "requested action not supported",
    5: "error starting client-server protocol",
    6: "daemon unable to append to log file",
    10: "error in socket I/O",
    11: "error in file I/O",
    12: "error in rsync protocol data stream",
    13: "errors with program diagnostics",
    14: "error in IPC code",
    20: "received SIGUSR1 or SIGINT",
    21: "some error returned by waitpid()",
    22: "error allocating core memory buffers",
    23: "partial transfer due to error",
    24: "partial transfer due to vanished source files",
    25: "the --max-delete limit stopped deletions",
    30: "timeout in data send/receive",
    35: "timeout waiting for daemon connection",
    127: "rsync not found (on the host, or here)",
    255: "ssh failed (connection, authentication or host key)",
}

_PROGRESS_RE = re.compile(
    r"^\s*(?P<bytes>[\d,.']+)\s+(?P<pct>\d+)%\s+(?P<rate>\S+)\s+(?P<eta>[\d:]+)"
    r"(?:\s+\(xfr#(?P<xfr>\d+),\s+(?:to|ir)-chk=(?P<left>\d+)/(?P<total>\d+)\))?"
)
_STAT_RE = re.compile(r"^(?P<key>[A-Z][A-Za-z ]+):\s+(?P<value>[\d,.']+)")
_MARKER = ITEM_MARKER.encode()
_AT = len(_MARKER)
_UPDATES = (b"<", b">", b"c", b"h")
_KINDS = (b"f", b"L")


def parse_int(text: str) -> int:
    """An integer printed by rsync, thousands separators dropped (0 when none)."""
    digits = re.sub(r"[^\d]", "", text)
    return int(digits) if digits else 0


def exit_meaning(code: int | None) -> str:
    """What rsync's exit code means, in words."""
    if code is None:
        return "did not finish"
    if code < 0:
        return f"killed by signal {-code}"
    return EXIT_CODES.get(code, "unknown error")


@dataclass
class RsyncProgress:
    """Where one rsync run stands (updated by :class:`RsyncReader`)."""

    bytes: int = 0  # file data sent so far (progress2)
    rate: str = ""  # rsync's transfer rate text, e.g. "12.30MB/s"
    files_checked: int = 0  # files of the list done (transferred or found up to date)
    files_total: int = 0  # files in the list, once rsync knows
    files_changed: int = 0  # files and symlinks whose data was (re)sent
    changed: list[str] = field(default_factory=list)  # their names (first ``keep_names``)
    stats: dict[str, int] = field(default_factory=dict)  # the --stats block

    @property
    def files_transferred(self) -> int:
        """Files and symlinks sent (rsync's own count leaves symlinks out)."""
        return max(self.files_changed, self.stats.get("Number of regular files transferred", 0))

    @property
    def bytes_transferred(self) -> int:
        """Size of the files (re)sent (``Total transferred file size``)."""
        return self.stats.get("Total transferred file size", self.bytes)

    @property
    def bytes_sent(self) -> int:
        """Bytes rsync wrote to the connection, protocol and file list included."""
        return self.stats.get("Total bytes sent", self.bytes)


class RsyncReader:
    """Incremental parser of rsync's stdout; ``feed`` returns True when progress moved.

    Cheap per line (a first sync of 2,000 files prints some 6,000 lines per host):
    only the newest progress line of each chunk is parsed.
    """

    def __init__(self, *, keep_names: int = 1000) -> None:
        self.progress = RsyncProgress()
        self._buf = b""
        self._keep = keep_names

    def feed(self, data: bytes) -> bool:
        """Take a chunk of stdout (lines may be split across chunks)."""
        lines = (self._buf + data).replace(b"\r", b"\n").split(b"\n")
        self._buf = lines.pop()
        return self._lines(lines)

    def close(self) -> None:
        """End of output: parse what is left without a line end."""
        if self._buf:
            self._lines([self._buf])
            self._buf = b""

    def _lines(self, lines: list[bytes]) -> bool:
        p = self.progress
        moved = False
        newest: bytes | None = None  # the newest progress line
        counted: bytes | None = None  # the newest one with the (xfr#, to-chk=) part
        for raw in lines:
            if not raw:
                continue
            if raw.startswith(_MARKER):
                # update type: < sent, > received, c created, h hard link; f file, L symlink
                if raw[_AT : _AT + 1] in _UPDATES and raw[_AT + 1 : _AT + 2] in _KINDS:
                    p.files_changed += 1
                    moved = True
                    if len(p.changed) < self._keep:
                        name = raw[_AT:].split(b" ", 2)[-1]
                        p.changed.append(name.decode("utf-8", errors="replace"))
            elif b"%" in raw:
                newest = raw
                if b"-chk=" in raw:
                    counted = raw
            elif raw[:1].isupper():
                stat = _STAT_RE.match(raw.decode("utf-8", errors="replace"))
                if stat is not None:
                    p.stats[stat["key"].strip()] = parse_int(stat["value"])
        for line in (counted, newest):
            match = _PROGRESS_RE.match(line.decode(errors="replace")) if line else None
            if match is None:
                continue
            moved = True
            p.bytes = parse_int(match["bytes"])
            p.rate = match["rate"]
            if match["total"] is not None:
                p.files_total = int(match["total"])
                p.files_checked = p.files_total - int(match["left"])
        return moved
