"""``prepare_dependencies``: push a code tree to machines and pip-install its
requirements there, with each machine's own interpreter."""

from __future__ import annotations

import asyncio
import shlex
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from corral.cluster.model import Cluster
from corral.errors import Invalid
from corral.fleet.fanout import run_on_hosts
from corral.service.machines import machine_host, machines_ssh
from corral.service.settings import ServerSettings
from corral.store.models import Machine
from corral.sync.push import normalize_dest, sync_tree
from corral.transport.choose import transport_for

PIP_TIMEOUT = 1800.0


async def prepare_dependencies(
    machines: Sequence[Machine],
    settings: ServerSettings,
    *,
    source: str,
    dest: str | None,
    requirements: str | None,
    python: str | None,
) -> dict[str, Any]:
    """Sync ``source`` to every machine (same path unless ``dest``), then
    ``PYTHON -m pip install -r DEST/REQUIREMENTS`` there; one result per machine."""
    root = Path(source).expanduser()
    if not root.is_dir():
        raise Invalid(
            f"source {source!r} is not a directory on the server", details={"field": "source"}
        )
    if requirements is not None:
        req = (root / requirements).resolve()
        if not req.is_relative_to(root.resolve()) or not req.is_file():
            raise Invalid(
                f"{requirements!r} is not a file of {source}", details={"field": "requirements"}
            )
    hosts = tuple(machine_host(m) for m in machines)
    cluster = Cluster(hosts, source="corral serve")
    ssh = machines_ssh(machines, settings)
    report = await sync_tree(cluster, root, dest, ssh, python=python)
    target = normalize_dest(dest, str(root.resolve()))
    results: dict[str, dict[str, Any]] = {
        m.name: {"machine_id": m.id, "synced": report.local, "sync": None, "pip": None}
        for m in machines
    }
    for synced in report.hosts:
        entry = results.get(synced.host)
        if entry is not None:
            entry["sync"] = synced.to_json()
            entry["synced"] = bool(synced.ok)
    if requirements is not None:
        ready = [h for h, m in zip(hosts, machines, strict=True) if results[m.name]["synced"]]
        transport = transport_for(cluster, ssh)
        try:
            outcomes = await asyncio.gather(
                *(
                    run_on_hosts(
                        transport,
                        [h],
                        _pip(h.python or python, target, requirements),
                        timeout=PIP_TIMEOUT,
                        capture_limit=8192,
                    )
                    for h in ready
                )
            )
            for h, (outcome,) in zip(ready, outcomes, strict=True):
                results[h.name]["pip"] = outcome.to_dict()
        finally:
            await transport.close()
    ok = all(r["synced"] and (r["pip"] is None or r["pip"]["ok"]) for r in results.values())
    return {"ok": ok, "dest": target, "files": report.files, "machines": results}


def _pip(python: str | None, target: str, requirements: str) -> str:
    interpreter = python or "python3"
    return (
        f"{shlex.quote(interpreter)} -m pip install --disable-pip-version-check -q "
        f"-r {shlex.quote(str(Path(target) / requirements))}"
    )
