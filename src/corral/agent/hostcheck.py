"""The pre-flight's host checks answered in the agent's own session.

When the coordinator's probe carries ``"facts"`` (the parameters the checklist
sends :mod:`corral.agent.hostfacts`), the agent gathers the host's facts itself
instead of the checklist starting that program in a session of its own: one
process and one session per host for both. On the master host it listens on the
master port while the checks run, as the program does. Until the ``start`` op it
then answers the checklist's ``connect`` and ``time`` requests; the listener is
closed before anything is launched (or when the launch is called off).
"""

from __future__ import annotations

import socket
import time
from typing import Any


class HostChecks:
    """One host's facts, its listener on the master port, and the answers to the
    checklist's requests (:func:`corral.agent.hostfacts.main`'s, in this process)."""

    def __init__(self, params: dict[str, Any]) -> None:
        from corral.agent import hostfacts

        self._facts = hostfacts
        self._listener: socket.socket | None = None
        listener: dict[str, Any] | None = None
        self.facts: dict[str, Any] | None = None
        self.error: str | None = None
        started = time.monotonic()
        try:
            if params.get("listen_port") is not None:
                self._listener, listener = hostfacts.listen(int(params["listen_port"]))
            self.facts = hostfacts.facts(params, listener)
        except Exception as exc:  # the checklist asks the host its own way then
            self.error = f"{type(exc).__name__}: {exc}"
        self.seconds = time.monotonic() - started

    def reply(self) -> dict[str, Any]:
        """The fields the probe's answer carries: the facts and how long they took,
        or why there are none."""
        if self.facts is None:
            return {"facts_error": self.error}
        return {"facts": self.facts, "facts_s": round(self.seconds, 6)}

    def answer(self, op: dict[str, Any]) -> dict[str, Any] | None:
        """The event answering a ``connect`` or ``time`` request (None: not one)."""
        if op.get("op") == "connect":
            try:
                addr, port, timeout = str(op["addr"]), int(op["port"]), float(op["timeout"])
            except (KeyError, TypeError, ValueError):
                return {"event": "connect", "ok": False, "error": "bad connect request"}
            return {"event": "connect", **self._facts.connect(addr, port, timeout)}
        if op.get("op") == "time":
            return {"event": "time", "time": time.time()}
        return None

    def close(self) -> None:
        """Stop listening on the master port (before the launch binds it)."""
        if self._listener is not None:
            self._listener.close()
            self._listener = None


def host_checks(params: object) -> HostChecks | None:
    """:class:`HostChecks` for a probe's ``facts`` parameters (None: none asked)."""
    return HostChecks(params) if isinstance(params, dict) else None
