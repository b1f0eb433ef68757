"""What a host's agent reports before anything is launched (stdlib only)."""

from __future__ import annotations

import importlib.util
import os
import socket
import sys
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
