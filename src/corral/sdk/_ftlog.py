"""torchft's logging in the ranks of an in-place job: warnings only by default.

torchft logs every quorum at INFO, from its Rust side (``RUST_LOG``, to stderr)
and its Python side (the ``torchft.manager`` logger): thousands of lines for a
short job, in the live output and the job page. :func:`quiet_torchft` (called by
the rank wrapper for every rank with a Lighthouse, and by ``sdk.fault_tolerant``)
sets both to the level of ``CORRAL_TORCHFT_LOG`` (``warning`` by default;
``info`` or ``debug`` for more, in the job's ``--env``; a ``RUST_LOG`` of the
job's own wins for the Rust side) and installs a :class:`TorchftGate` on the
``torchft.manager`` logger:

- the lines about quorum changes and healing (:data:`SHOWN`: a reconfiguration,
  healing from a peer, a peer served) are kept whatever the level: printed as
  ``[torchft] MESSAGE`` on stderr when the level would drop them (corral reads the
  healing source from them);
- torchft's "Unable to reset NCCL flight recorder recording so traces will be
  incorrect." at every reconfiguration on a torch without NCCL's flight recorder
  (CPU builds) is folded: one line says so, the rest are not shown (all of them
  at ``info``);
- everything else passes at the level or above, to the script's own handlers.
"""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Callable, MutableMapping

from corral.contract import TORCHFT_LOG_ENV

LEVELS = {"debug": logging.DEBUG, "info": logging.INFO, "warning": logging.WARNING}
LEVELS |= {"warn": logging.WARNING, "error": logging.ERROR}
_RUST = {logging.DEBUG: "debug", logging.INFO: "info", logging.WARNING: "warn"}
FLIGHT_RECORDER_NOISE = "Unable to reset NCCL flight recorder recording"
#: The torchft.manager messages about quorum changes and healing, always shown.
SHOWN = (
    "reconfiguring for",
    "healing required",
    "fetching checkpoint from",
    "peers need recovery",
)
FOLD_NOTE = (
    "[torchft] this torch has no NCCL flight recorder: torchft's 'Unable to reset NCCL "
    "flight recorder recording' warning at each reconfiguration is not shown "
    f"({TORCHFT_LOG_ENV}=info shows it)"
)


def torchft_level(env: MutableMapping[str, str] | None = None) -> int:
    """The level of ``CORRAL_TORCHFT_LOG`` (WARNING when unset or not a level)."""
    raw = (os.environ if env is None else env).get(TORCHFT_LOG_ENV, "").strip().lower()
    return LEVELS.get(raw, logging.WARNING)


class TorchftGate(logging.Filter):
    """The filter of the ``torchft.manager`` logger (see the module doc); ``tap`` sees
    every record first (``sdk.fault_tolerant``'s quorum events)."""

    def __init__(self, level: int) -> None:
        super().__init__()
        self.level = level
        self.folded = 0
        self.tap: Callable[[logging.LogRecord], None] | None = None

    def filter(self, record: logging.LogRecord) -> bool:
        if self.tap is not None:
            self.tap(record)
        message = record.getMessage()
        if FLIGHT_RECORDER_NOISE in message and self.level > logging.INFO:
            if self.folded == 0:
                print(FOLD_NOTE, file=sys.stderr, flush=True)
            self.folded += 1
            return False
        if record.levelno >= self.level:
            if (
                record.levelno < logging.WARNING
                and not logging.getLogger(record.name).hasHandlers()
            ):
                print(f"[torchft] {message}", file=sys.stderr, flush=True)  # nobody else would
                return False
            return True
        if any(key in message for key in SHOWN):
            print(f"[torchft] {message}", file=sys.stderr, flush=True)
        return False


_gate: TorchftGate | None = None


def quiet_torchft(env: MutableMapping[str, str] | None = None) -> TorchftGate:
    """Set torchft's Rust and Python logging to ``CORRAL_TORCHFT_LOG``'s level (before
    torchft starts its Rust logger) and install the gate, once per process; the gate."""
    global _gate
    env = os.environ if env is None else env
    level = torchft_level(env)
    env.setdefault("RUST_LOG", _RUST.get(level, "error"))
    if _gate is None:
        _gate = TorchftGate(level)
        logging.getLogger("torchft").setLevel(level)
        manager = logging.getLogger("torchft.manager")
        # its quorum and healing lines are made (and gated), whatever the level
        manager.setLevel(min(level, logging.INFO))
        manager.addFilter(_gate)
    return _gate
