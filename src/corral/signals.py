"""Ctrl-C and SIGTERM as a request to stop: the one mapping every entry point uses.

``corral run``, ``corral calibrate``, ``corral sync``, the server's supervisor
process and the engine's own supervisor all stop their work the same way when
the user presses Ctrl-C or a process manager sends SIGTERM: the signal calls a
``stop`` function on the event loop (a second signal calls it again; what that
means, e.g. "kill now", is the stop function's business).
"""

from __future__ import annotations

import asyncio
import signal
from collections.abc import Callable, Iterator
from contextlib import contextmanager

STOP_SIGNALS: tuple[signal.Signals, ...] = (signal.SIGINT, signal.SIGTERM)
"""The signals that ask corral to stop: Ctrl-C and a polite kill."""


@contextmanager
def stop_on_signals(stop: Callable[[], object]) -> Iterator[None]:
    """Within the block, each of :data:`STOP_SIGNALS` calls ``stop`` on the running
    event loop instead of ending the process; the previous handling is restored after."""
    loop = asyncio.get_running_loop()
    previous = {signum: signal.getsignal(signum) for signum in STOP_SIGNALS}
    for signum in STOP_SIGNALS:
        loop.add_signal_handler(signum, stop)
    try:
        yield
    finally:
        for signum, handler in previous.items():
            loop.remove_signal_handler(signum)
            if handler is not None:
                signal.signal(signum, handler)
