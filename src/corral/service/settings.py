"""How ``corral serve`` reaches machines and where it keeps jobs."""

from __future__ import annotations

import secrets
from dataclasses import dataclass
from pathlib import Path

from corral.notify.service import DeliveryPolicy


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
    #: the server's address as its users reach it (links in notifications); None: paths
    public_url: str | None = None
    #: notifications (corral.notify): tries per delivery, the first retry's delay (doubled
    #: each time, at most notify_max_backoff), each try's timeout, deliveries in flight
    notify_attempts: int = 10
    notify_backoff: float = 5.0
    notify_max_backoff: float = 600.0
    notify_timeout: float = 10.0
    notify_concurrency: int = 8
    #: how many jobs one user may have queued (their own cap: corral serve user limit
    #: NAME --queued N); one more is a 429
    max_queued: int = 1000
    #: where a non-admin's tracking targets may write or connect besides the job's run
    #: dir: absolute paths and URL prefixes (corral serve --tracking-allow; see
    #: corral.service.trust)
    tracking_allow: tuple[str, ...] = ()


def new_id(prefix: str) -> str:
    """A short random id: ``prefix-`` and 10 hex digits."""
    return f"{prefix}-{secrets.token_hex(5)}"


def delivery_policy(settings: ServerSettings) -> DeliveryPolicy:
    """How the server's notifications are sent (:mod:`corral.notify`)."""
    return DeliveryPolicy(
        attempts=settings.notify_attempts,
        backoff=settings.notify_backoff,
        max_backoff=settings.notify_max_backoff,
        timeout=settings.notify_timeout,
        concurrency=settings.notify_concurrency,
        public_url=settings.public_url,
    )
