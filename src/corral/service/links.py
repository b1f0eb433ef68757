"""The link matrix between registered machines (the web machines page's heatmap):
the same measurement and verdict as ``corral check --links``
(:func:`corral.diagnose.linkrun.measure_links`, :func:`corral.diagnose.links.score`),
over the addresses the server reaches the machines at. The last result is kept
in memory for the page."""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from corral.cluster.model import Cluster
from corral.defaults import DEFAULT_CONNECT_TIMEOUT
from corral.diagnose.linkrun import measure_links
from corral.diagnose.links import (
    DEFAULT_MIN_RATIO,
    LinkBudget,
    LinkThresholds,
    score,
)
from corral.diagnose.links_render import grid_json
from corral.errors import Conflict
from corral.service.machines import machine_host, machines_ssh
from corral.service.settings import ServerSettings
from corral.store.models import Machine
from corral.transport.choose import transport_for

__all__ = ["LinksIn", "LinksOut", "measure_machines"]


class LinksIn(BaseModel):
    """What to measure: machines (ids or names; default every remote one) and the
    thresholds of ``corral check --links``."""

    model_config = ConfigDict(extra="forbid")

    machine_ids: list[str] | None = Field(default=None, max_length=256)
    min_ratio: float = Field(default=DEFAULT_MIN_RATIO, ge=0.0, lt=1.0, allow_inf_nan=False)
    min_gbs: float = Field(default=0.0, ge=0.0, le=1e6, allow_inf_nan=False)
    seconds: float = Field(default=12.0, gt=0.0, le=120.0, allow_inf_nan=False)


class LinksOut(BaseModel):
    """The matrix (``pairs``, ``ring``, ...), its verdict (``score``), the heatmap
    cells (``grid``: rows send, columns receive) and when it was measured."""

    measured: bool
    measured_at: float | None = None
    data: dict[str, Any] = Field(default_factory=dict)


async def measure_machines(
    machines: Sequence[Machine], settings: ServerSettings, body: LinksIn
) -> LinksOut:
    """Measure the link matrix between ``machines`` (Conflict with fewer than two
    remote machines: local ones are this machine)."""
    remote = [m for m in machines if not m.local]
    if len(remote) < 2:
        raise Conflict(
            "the link matrix needs two or more remote machines",
            details={"machines": [m.name for m in remote]},
        )
    hosts = [machine_host(m) for m in remote]
    ssh = machines_ssh(remote, settings)
    transport = transport_for(Cluster(tuple(hosts)), ssh, connect_timeout=DEFAULT_CONNECT_TIMEOUT)
    try:
        matrix = await measure_links(transport, hosts, budget=LinkBudget(seconds=body.seconds))
    finally:
        await transport.close()
    thresholds = LinkThresholds(min_ratio=body.min_ratio, min_gbs=body.min_gbs)
    judged = score(matrix, thresholds)
    data = {
        **matrix.to_json(),
        "score": judged.to_json(),
        "grid": grid_json(matrix, judged),
        "thresholds": {"min_ratio": body.min_ratio, "min_gbs": body.min_gbs},
    }
    return LinksOut(measured=True, measured_at=time.time(), data=data)
