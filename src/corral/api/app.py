"""The FastAPI app of ``corral serve``.

On start it re-attaches to the jobs whose supervisor still runs (and marks the
others lost), then runs two background tasks: the ingest of every active job's
events and the scheduler of queued jobs. Every route but ``/healthz`` needs the
bearer token (checked by :class:`TokenMiddleware`, before any route runs).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager

from fastapi import FastAPI, Request, Response
from starlette.middleware.base import BaseHTTPMiddleware
from starlette.routing import Match
from starlette.types import ASGIApp

from corral import __version__
from corral.api import errors
from corral.api.auth import OPEN_PATHS, token_matches
from corral.api.metrics import CONTENT_TYPE, Metrics
from corral.api.routers import jobs, network, tasks
from corral.api.services import Services

log = logging.getLogger("corral.serve")


class TokenMiddleware(BaseHTTPMiddleware):
    """401 (in the one error shape) for every request without the token, except
    ``/healthz``; records each request's latency for ``/metrics``."""

    def __init__(self, app: ASGIApp, token: str, metrics: Metrics) -> None:
        super().__init__(app)
        self.token = token
        self.metrics = metrics

    async def dispatch(
        self, request: Request, call_next: Callable[[Request], Awaitable[Response]]
    ) -> Response:
        started = time.perf_counter()
        if request.url.path not in OPEN_PATHS and not token_matches(
            request.headers.get("authorization"), self.token
        ):
            response: Response = errors.error_response(
                401,
                "unauthorized",
                "a valid bearer token is required",
                headers={"WWW-Authenticate": "Bearer"},
            )
        else:
            response = await call_next(request)
        route = _route_of(request)
        self.metrics.latency.labels(request.method, route, str(response.status_code)).observe(
            time.perf_counter() - started
        )
        return response


def _route_of(request: Request) -> str:
    """The route template (``/api/jobs/{job_id}``), so ids do not explode the labels."""
    for route in request.app.router.routes:
        match, _ = route.matches(request.scope)
        if match is Match.FULL:
            return str(getattr(route, "path", "other"))
    return "unmatched"


def create_app(svc: Services, token: str, *, background: bool = True) -> FastAPI:
    """The app over ``svc``; ``background`` runs re-attach, ingest and the scheduler."""
    metrics = Metrics(svc.store)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        svc.jobs.bind(asyncio.get_running_loop())
        running: list[asyncio.Task[None]] = []
        if background:
            outcome = await asyncio.to_thread(svc.jobs.reattach)
            for job_id, what in outcome.items():
                log.info("job %s: %s", job_id, what)
            running.append(asyncio.create_task(svc.jobs.run_ingest()))
            running.append(asyncio.create_task(svc.tasks.run(svc.settings.schedule_interval)))
        try:
            yield
        finally:
            for task in running:
                task.cancel()
            for task in running:
                with contextlib.suppress(asyncio.CancelledError):
                    await task

    app = FastAPI(
        title="corral",
        version=__version__,
        description="Launch, check, watch and recover distributed training on machines "
        "you own. Every route but /healthz needs `Authorization: Bearer <token>` "
        "(`corral serve --print-token`). Errors: "
        '`{"error": {"type", "message", "details"}}`.',
        lifespan=lifespan,
    )
    app.state.services = svc
    app.add_middleware(TokenMiddleware, token=token, metrics=metrics)
    errors.install(app)
    for module in (network, tasks, jobs):
        app.include_router(module.router)

    @app.get("/healthz", tags=["server"], summary="Liveness (no token needed)")
    def healthz() -> dict[str, str]:
        return {"status": "ok"}

    @app.get(
        "/metrics",
        tags=["server"],
        summary="Prometheus metrics",
        response_class=Response,
        responses={200: {"content": {"text/plain": {}}}},
    )
    def prometheus() -> Response:
        return Response(metrics.render(), media_type=CONTENT_TYPE)

    return app
