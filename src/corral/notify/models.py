"""The API's bodies of notification targets and their delivery log (pydantic).

A target's secret (a webhook's shared secret) is accepted and never returned; a
webhook URL is returned with its credentials masked (:func:`corral.notify.urls.mask_url`),
an apprise URL, which carries its service's credentials, in apprise's privacy form.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator

from corral.notify.events import EVENTS, EventName
from corral.notify.urls import MAX_URL, check_url


def _all_events() -> list[EventName]:
    return list(EVENTS)  # type: ignore[arg-type]


class WebhookIn(BaseModel):
    """A webhook: where to POST, the shared secret that signs the body, which events."""

    model_config = ConfigDict(extra="forbid")

    url: str = Field(
        max_length=MAX_URL,
        description="http:// or https:// URL the events go to (a host, a port 1-65535). "
        "Its address must be allowed by the server's address rule (`GET "
        "/api/notify/addresses`). Credentials in it are masked when it is shown.",
    )
    secret: str = Field(
        min_length=8,
        max_length=1024,
        description="Shared secret: the body's HMAC-SHA256 under it is sent as "
        "`X-Corral-Signature: sha256=<hex>`. Stored to sign, never returned.",
    )
    events: list[EventName] = Field(
        default_factory=_all_events, min_length=1, description="The events it wants."
    )

    @field_validator("url")
    @classmethod
    def _http_url(cls, value: str) -> str:
        return check_url(value)


class NotifierIn(BaseModel):
    """A chat or mail target: an apprise URL (``slack://...``, ``mailto://...``) and
    which events."""

    model_config = ConfigDict(extra="forbid")

    url: str = Field(
        min_length=3,
        max_length=4000,
        description="An apprise URL (https://github.com/caronc/apprise/wiki). It holds "
        "the service's credentials: returned with them masked.",
    )
    events: list[EventName] = Field(
        default_factory=_all_events, min_length=1, description="The events it wants."
    )

    @field_validator("url")
    @classmethod
    def _no_control(cls, value: str) -> str:
        if any(ord(c) < 32 or ord(c) == 127 for c in value):
            raise ValueError("must not contain control characters")
        return value


class HookOut(BaseModel):
    """A notification target as the API shows it (no secret)."""

    id: str
    kind: str = Field(description="`webhook` or `apprise`.")
    url: str = Field(
        description="The URL, its credentials masked (user-info, query values "
        "named like credentials; an apprise URL in apprise's privacy form)."
    )
    events: list[str]
    created: float
    has_secret: bool = Field(description="Whether it signs with a secret (never shown).")
    pending: int = Field(0, description="Deliveries waiting to be sent or retried.")


class DeliveryOut(BaseModel):
    """One entry of a target's delivery log."""

    id: int
    hook_id: str
    event: str
    job_id: str | None
    state: str = Field(description="`pending`, `delivered` or `failed` (gave up).")
    attempts: int
    status_code: int | None = Field(description="The receiver's last HTTP status.")
    last_error: str | None
    created: float
    last_try: float | None
    next_try: float | None = Field(description="When it is tried again (pending only).")
    payload: dict[str, Any]
