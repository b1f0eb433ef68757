"""What a host's agent reports before anything is launched (stdlib only)."""

from __future__ import annotations

import importlib.util
import os
import socket
import sys
from typing import Any


def probe_info(workdir: str, port: int | None) -> dict[str, Any]:
    """Interpreter, hostname, torch, whether ``workdir`` exists, and for the master
    host whether ``port`` can be bound (0: a free port is picked and returned)."""
    info: dict[str, Any] = {
        "executable": sys.executable,
        "hostname": socket.gethostname(),
        "torch": importlib.util.find_spec("torch") is not None,
        "workdir_ok": not workdir or os.path.isdir(os.path.expanduser(workdir)),
        "port": None,
    }
    if port is not None:
        sock = socket.socket()
        # as TCPStore does: a port in TIME_WAIT after the last job is free to reuse
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(("", port))
            info["port"] = sock.getsockname()[1]
        except OSError as exc:
            info["port_error"] = str(exc)
        finally:
            sock.close()
    return info
