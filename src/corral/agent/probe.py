"""What a host's agent reports before anything is launched (stdlib only).

The agent answers a probe with :func:`probe_info`; the coordinator checks the
answer with :func:`read_answer`, as strictly as pydantic checks every later
agent event (:mod:`corral.agent.events`), but without importing it: the probe's
round trip is on the way to every launch.
"""

from __future__ import annotations

import importlib.util
import math
import os
import socket
import sys
from collections.abc import Mapping
from typing import Any

import corral


def try_bind(port: int, host: str = "") -> tuple[int | None, OSError | None]:
    """Bind ``port`` (0: any free one) the way TCPStore will: a port in TIME_WAIT
    after the last job counts as free. Returns (the port, None) or (None, the error)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError as exc:
            return None, exc
        return int(sock.getsockname()[1]), None


def probe_info(workdir: str, port: int | None) -> dict[str, Any]:
    """corral's version, interpreter, hostname, torch, whether ``workdir`` exists, and
    for the master host whether ``port`` can be bound (0: a free port is picked)."""
    info: dict[str, Any] = {
        "version": corral.__version__,
        "executable": sys.executable,
        "hostname": socket.gethostname(),
        "torch": importlib.util.find_spec("torch") is not None,
        "workdir_ok": not workdir or os.path.isdir(os.path.expanduser(workdir)),
        "port": None,
    }
    if port is not None:
        info["port"], error = try_bind(port)
        if error is not None:
            info["port_error"] = str(error)
    return info


MAX_TEXT = 64 * 1024
"""Longest text field of an agent event (characters)."""
MAX_VERSION = 200


def read_answer(event: Mapping[str, Any]) -> dict[str, Any]:
    """A probe answer's fields (those of :func:`probe_info`, ``port_error`` and the
    ``time`` it was sent), checked: ValueError ``invalid agent event: probe.<field>:
    <why>`` for a missing field or one of the wrong type or size. Other keys (the
    host's facts) are the checklist's to read."""

    def fail(key: str, why: str) -> ValueError:
        return ValueError(f"invalid agent event: probe.{key}: {why}")

    def text(key: str, limit: int = MAX_TEXT, optional: bool = False) -> str | None:
        value = event.get(key)
        if value is None and optional:
            return None
        if not isinstance(value, str):
            raise fail(key, f"expected a string, got {type(value).__name__}")
        if len(value) > limit:
            raise fail(key, f"at most {limit} characters, got {len(value)}")
        return value

    def flag(key: str) -> bool:
        value = event.get(key)
        if not isinstance(value, bool):
            raise fail(key, f"expected true or false, got {type(value).__name__}")
        return value

    port = event.get("port")
    if port is not None and (type(port) is not int or not 0 <= port <= 65535):
        raise fail("port", f"expected a port number (0-65535) or null, got {port!r:.40}")
    sent = event.get("time")
    if not isinstance(sent, int | float) or isinstance(sent, bool) or not 0 <= sent < math.inf:
        raise fail("time", f"expected a time (seconds, >= 0), got {sent!r:.40}")
    return {
        "event": "probe",
        "time": float(sent),
        "executable": text("executable"),
        "hostname": text("hostname"),
        "torch": flag("torch"),
        "workdir_ok": flag("workdir_ok"),
        "port": port,
        "port_error": text("port_error", optional=True),
        "version": text("version", MAX_VERSION, optional=True),
    }
