"""What the checkpoint modules share: the error, the limits, the file names.

A leaf module: it imports nothing else of :mod:`corral.recovery.checkpoints`.
"""

from __future__ import annotations

import re

from corral.errors import TransportError

__all__ = [
    "HOSTSIDE",
    "KILL_GRACE",
    "READ_SIZE",
    "REPLICA_SOURCE",
    "SHIPPED",
    "STALL_TIMEOUT",
    "SURVEY_TIMEOUT",
    "WINDOW",
    "CheckpointTransferError",
    "step_of",
]

#: The host-side program (run through :mod:`corral.remote.python`).
HOSTSIDE = "corral.recovery.checkpoints.hostside"
#: Modules shipped to the hosts (dependency order): the contract's checkpoint files.
SHIPPED = ("corral.contract", HOSTSIDE)
#: Most bytes of one copy in flight between the source, the coordinator and a target.
WINDOW = 8 << 20
READ_SIZE = 1 << 20
SURVEY_TIMEOUT = 30.0
#: A copy during which nothing moves for this long is abandoned.
STALL_TIMEOUT = 60.0
KILL_GRACE = 2.0
#: How a placement or a copy names the coordinator's replica as its source.
REPLICA_SOURCE = "coordinator replica"

_RANK0_NAME = re.compile(r"ckpt-(\d+)\.pt")


class CheckpointTransferError(TransportError):
    """A checkpoint could not be listed, read or written on ``host``.

    ``errno_name`` is the host-side error (``"ENOSPC"`` for a full disk) when known.
    """

    def __init__(
        self,
        message: str,
        *,
        host: str,
        command: str | None = None,
        cause: str | None = None,
        errno_name: str | None = None,
    ) -> None:
        super().__init__(message, host=host, command=command, cause=cause)
        self.errno_name = errno_name


def step_of(name: str) -> int:
    """The step of a rank-0 checkpoint file name (``ckpt-NNNNNNNN.pt``); ValueError otherwise."""
    m = _RANK0_NAME.fullmatch(name)
    if m is None:
        raise ValueError(f"not a rank-0 checkpoint name: {name!r} (expected ckpt-NNNNNNNN.pt)")
    return int(m.group(1))
