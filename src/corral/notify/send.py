"""Sending one delivery: a signed JSON POST (a webhook), or one line through apprise.

apprise is an optional extra (``corral[notify]``); :func:`load_apprise` says which
to install when it is missing.
"""

from __future__ import annotations

import json
import logging
import re
from types import ModuleType
from typing import Any

import httpx

from corral import __version__
from corral.errors import Invalid
from corral.notify.sign import SIGNATURE_HEADER, sign
from corral.notify.urls import Pinned, mask_url

EXTRA_HINT = "chat and mail notifications need apprise: pip install 'corral[notify]'"


def body_of(payload: dict[str, Any]) -> bytes:
    """The exact bytes POSTed (and signed)."""
    return json.dumps(payload, separators=(",", ":"), sort_keys=True).encode()


def webhook_headers(secret: str | None, body: bytes, event: str, delivery: int) -> dict[str, str]:
    """The headers of a webhook POST: the signature, the event, the delivery id."""
    headers = {
        "Content-Type": "application/json",
        "User-Agent": f"corral/{__version__}",
        "X-Corral-Event": event,
        "X-Corral-Delivery": str(delivery),
    }
    if secret:
        headers[SIGNATURE_HEADER] = sign(secret, body)
    return headers


async def post_webhook(
    client: httpx.AsyncClient,
    target: Pinned,
    headers: dict[str, str],
    body: bytes,
    timeout: float,
) -> tuple[int | None, str | None]:
    """POST ``body`` to the checked address of ``target`` (its host name kept for the
    ``Host`` header and TLS); (the status, None) on a 2xx, else (the status or None,
    why). Any failure to send is a (None, why), never an exception."""
    extensions = {"sni_hostname": target.sni} if target.sni else None
    try:
        response = await client.post(
            target.url,
            content=body,
            headers={**headers, "Host": target.host_header},
            timeout=timeout,
            extensions=extensions,
        )
    except Exception as exc:  # refused, timed out, cut, or a URL no socket takes
        return None, failure(exc)
    if 200 <= response.status_code < 300:
        return response.status_code, None
    return response.status_code, f"HTTP {response.status_code} {response.reason_phrase}".strip()


def failure(exc: BaseException) -> str:
    """One line saying why a delivery failed (its type and message; no URL, which may
    hold a credential, and no traceback)."""
    text = str(exc).splitlines()[0][:300] if str(exc) else ""
    text = re.sub(r"[a-z][a-z0-9+.-]*://\S+", lambda m: mask_url(m.group(0)), text)
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def load_apprise() -> ModuleType:
    """The apprise module (Invalid naming the extra when it is not installed)."""
    try:
        import apprise
    except ImportError as exc:
        raise Invalid(EXTRA_HINT, details={"extra": "notify"}) from exc
    return apprise


def apprise_privacy_url(url: str) -> str:
    """``url`` with its credentials masked (Invalid when apprise does not know it)."""
    apprise = load_apprise()
    plugin = apprise.Apprise.instantiate(url, suppress_exceptions=True)
    if plugin is None or isinstance(plugin, bool):
        raise Invalid(
            "not an apprise URL apprise can send to (e.g. slack://..., mailto://..., "
            "json://host:port/path)",
            details={"field": "url"},
        )
    return str(plugin.url(privacy=True))


def send_apprise(url: str, title: str, text: str) -> str | None:
    """Send one notification (blocking: run it in a thread); None when sent, else why."""
    apprise = load_apprise()
    sender = apprise.Apprise()
    if not sender.add(url):
        return "not an apprise URL"
    with apprise.LogCapture(level=logging.WARNING) as captured:
        sent = sender.notify(body=text, title=title)
        said = captured.getvalue().strip()
    if sent:
        return None
    first = said.splitlines()[0].strip() if said else ""
    return (first or "apprise could not send it")[:500]
