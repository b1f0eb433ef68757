"""The notification routes of ``corral serve`` as functions: webhooks and chat/mail
targets (apprise URLs) added, listed, removed, their delivery logs, and the address
rule of where they may be sent."""

from __future__ import annotations

from typing import Any

from corral.client.http import Client, segment

#: The route of each kind of target.
ROUTES = {"webhook": "/api/webhooks", "chat": "/api/notifiers"}


def add(client: Client, kind: str, body: dict[str, Any]) -> dict[str, Any]:
    """Add a target (``HookOut``, never its secret)."""
    hook: dict[str, Any] = client.call("POST", ROUTES[kind], json=body)
    return hook


def targets(client: Client, kind: str) -> list[dict[str, Any]]:
    """Every target of ``kind``."""
    found: list[dict[str, Any]] = client.call("GET", ROUTES[kind])
    return found


def remove(client: Client, kind: str, hook_id: str) -> dict[str, Any]:
    """Remove a target; it as it was."""
    hook: dict[str, Any] = client.call("DELETE", f"{ROUTES[kind]}/{segment(hook_id)}")
    return hook


def deliveries(client: Client, kind: str, hook_id: str, limit: int = 50) -> list[dict[str, Any]]:
    """A target's delivery log, newest first."""
    log: list[dict[str, Any]] = client.call(
        "GET", f"{ROUTES[kind]}/{segment(hook_id)}/deliveries", params={"limit": limit}
    )
    return log


ADDRESSES = "/api/notify/addresses"


def address_rule(client: Client) -> dict[str, Any]:
    """The address rule of notifications (``{"allow": [...]}``)."""
    rule: dict[str, Any] = client.call("GET", ADDRESSES)
    return rule


def set_address_rule(client: Client, allow: list[str]) -> dict[str, Any]:
    """Allow these kinds of address besides public ones (loopback, private, link_local)."""
    rule: dict[str, Any] = client.call("PUT", ADDRESSES, json={"allow": allow})
    return rule
