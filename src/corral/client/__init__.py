"""The client of ``corral serve`` (used by ``corral job`` and ``corral machine``).

:class:`Client` makes one request and turns an error answer into corral's error
tree (:mod:`corral.client.http`); :mod:`corral.client.jobs` and
:mod:`corral.client.machines` are the routes as functions; a job's live events
arrive as Server-Sent Events (:mod:`corral.client.sse`), resumed after a dropped
connection and decoded once into the engine's typed events
(:mod:`corral.client.events`); the token comes from ``CORRAL_TOKEN`` or a file
(:mod:`corral.client.token`). Nothing of the server (FastAPI, SQLAlchemy) is
imported.
"""

from __future__ import annotations

from corral.client.http import DEFAULT_SERVER, Client
from corral.client.sse import SseEvent, parse_sse
from corral.client.token import plain_http_warning, read_token

__all__ = ["DEFAULT_SERVER", "Client", "SseEvent", "parse_sse", "plain_http_warning", "read_token"]
