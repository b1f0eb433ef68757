"""A job request's ``calibration``: a file on the server, read for the planner.

The caller names a path on the server's machine, so what the server answers must not
tell them anything about that machine's files: a path that does not exist, one the
server cannot read, a directory, a device or a pipe, a huge file, a binary one and a
file that is no calibration all get the same 422 (naming the field). Only a file that
is a calibration of ``corral calibrate`` goes on to be matched with the job's machines
(whose mistakes name hosts, as for the CLI).
"""

from __future__ import annotations

import os
import stat

from corral.errors import ConfigError, Invalid
from corral.throughput.model import Calibration, parse_calibration

#: A calibration file is far smaller; a bigger file is not read.
MAX_CALIBRATION_BYTES = 16 * 1024 * 1024


def _unusable(given: str) -> Invalid:
    return Invalid(
        f"calibration: calibration file {given!r} cannot be used: it is not a file of "
        "`corral calibrate` that the server can read (give the path, on the server, of "
        "the JSON file corral calibrate saved)",
        details={"field": "calibration"},
    )


def server_calibration(given: str) -> Calibration:
    """The calibration in the server's file ``given`` (``~`` expanded; relative: to the
    server's working directory); one Invalid for every way it is not one."""
    path = os.path.expanduser(given)
    try:
        # never blocks on a pipe; a directory, a device or a pipe is refused by fstat
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except (OSError, ValueError):
        raise _unusable(given) from None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode) or info.st_size > MAX_CALIBRATION_BYTES:
            raise _unusable(given)
        chunks: list[bytes] = []
        size = 0
        while size <= MAX_CALIBRATION_BYTES:
            chunk = os.read(fd, 1 << 20)
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
    except OSError:
        raise _unusable(given) from None
    finally:
        os.close(fd)
    if size > MAX_CALIBRATION_BYTES:
        raise _unusable(given)
    try:
        return parse_calibration(b"".join(chunks).decode("utf-8"), path)
    except (UnicodeDecodeError, ConfigError):
        raise _unusable(given) from None
