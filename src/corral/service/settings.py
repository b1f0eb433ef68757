"""How ``corral serve`` reaches machines and where it keeps jobs."""

from __future__ import annotations

import secrets
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class ServerSettings:
    """The server's options (``corral serve``), shared by every service."""

    run_dir: Path = Path("runs")
    ssh_config: str | None = None
    accept_new_host_keys: bool = False
    insecure_no_host_key_check: bool = False
    plugins_dir: Path | None = None
    health_deadline: float = 20.0
    ping_deadline: float = 10.0
    ingest_interval: float = 0.2
    schedule_interval: float = 1.0
    health_interval: float = 30.0  # background health checks (load, online); 0: none


def new_id(prefix: str) -> str:
    """A short random id: ``prefix-`` and 10 hex digits."""
    return f"{prefix}-{secrets.token_hex(5)}"
