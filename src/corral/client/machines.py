"""The machine routes of ``corral serve`` as functions: register, list, check, remove."""

from __future__ import annotations

from typing import Any

from corral.client.http import Client, segment

LOCAL_PREFIX = "local-"
"""A local machine without a name gets ``local-0``, ``local-1``, ...: the names
``--hosts local:N`` gives its nodes, so logs, calibrations and the two kinds of
simulated node read alike (machines named before, ``local1``, keep their names)."""


def list_machines(client: Client) -> list[dict[str, Any]]:
    """Every registered machine (``MachineOut``), by name."""
    machines: list[dict[str, Any]] = client.call("GET", "/api/network/machines")
    return machines


def free_local_name(machines: list[dict[str, Any]]) -> str:
    """The first of ``local-0``, ``local-1``, ... that no machine is called."""
    taken = {m["name"] for m in machines}
    number = 0
    while f"{LOCAL_PREFIX}{number}" in taken:
        number += 1
    return f"{LOCAL_PREFIX}{number}"


def add(client: Client, body: dict[str, Any]) -> dict[str, Any]:
    """Register a machine (``MachineIn``); a local one without a name gets the first
    free ``local-N``. The machine as registered."""
    if body.get("local") and not body.get("name"):
        body = {**body, "name": free_local_name(list_machines(client))}
    machine: dict[str, Any] = client.call("POST", "/api/network/machines", json=body)
    return machine


def check(client: Client, names: list[str] | None = None) -> list[dict[str, Any]]:
    """Health-check the named machines now (all of them when none is named, in
    parallel on the server); each as it is now."""
    if not names:
        status = client.call("POST", "/api/network/health-check")
        machines: list[dict[str, Any]] = status["machines"]
        return machines
    return [client.call("POST", f"/api/network/machines/{segment(n)}/ping") for n in names]


def remove(client: Client, name: str) -> dict[str, Any]:
    """Remove the machine called ``name`` (a machine a job uses is refused); it as it
    was."""
    machine: dict[str, Any] = client.call(
        "DELETE", f"/api/network/machines/by-name/{segment(name)}"
    )
    return machine
