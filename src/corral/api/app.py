"""The FastAPI app of ``corral serve``.

On start it re-attaches to the jobs whose supervisor still runs (and marks the
others lost), then runs two background tasks: the ingest of every active job's
events and the scheduler of queued jobs. Every route but ``/healthz`` needs a
user's bearer token or web session (checked by :class:`TokenMiddleware`, before any
route runs, which also keeps the audit log).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from urllib.parse import quote

from fastapi import Depends, FastAPI, Request, Response
from fastapi.responses import RedirectResponse
from starlette.routing import Match
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from corral import __version__
from corral.api import errors
from corral.api.auth import OPEN_PATHS, PUBLIC_PREFIXES, bearer_value
from corral.api.docs import install_docs
from corral.api.hardening import MAX_REQUEST_BYTES, InputGuard, SecurityHeaders, no_nul_in_path
from corral.api.metrics import CONTENT_TYPE, Metrics
from corral.api.routers import compare, jobs, network, notify, queue, tasks, users
from corral.api.services import Services
from corral.service.audit import AuditLog, RequestAudit, open_request
from corral.service.users import Principal, Role, UserService, hash_token
from corral.sessions import (
    CSRF_HEADER,
    SAFE_METHODS,
    SESSION_COOKIE,
    Sessions,
    same_token,
)

log = logging.getLogger("corral.serve")


class TokenMiddleware:
    """Authentication, the viewer's read-only rule and the audit log, for every request
    (pure ASGI, so streams pass straight through).

    A request is let in with ``Authorization: Bearer <token>`` of an active user, or
    with a web session's cookie (:mod:`corral.sessions`), in which case a
    state-changing request to the API must also carry the session's CSRF token
    (header ``X-CSRF-Token``). Without either: a 401 in the one error shape for the
    API, a redirect to the login page for a page. ``/healthz``, the login page and the
    static files are open. A viewer's state-changing request to the API is a 403.
    Who made the request is ``request.state.principal`` (and ``request.state.via``:
    ``bearer`` or ``session``). Every state-changing request goes to the audit log
    with its outcome; each request's latency goes to ``/metrics``.
    """

    def __init__(
        self,
        app: ASGIApp,
        users: UserService,
        audit: AuditLog,
        metrics: Metrics,
        sessions: Sessions,
    ) -> None:
        self.app = app
        self.users = users
        self.audit = audit
        self.metrics = metrics
        self.sessions = sessions

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = time.perf_counter()
        status = {"code": 500}

        async def timed_send(message: Message) -> None:
            if message["type"] == "http.response.start":
                status["code"] = int(message["status"])
                request = Request(scope)
                self.metrics.latency.labels(
                    request.method, _route_of(request), str(status["code"])
                ).observe(time.perf_counter() - started)
            await send(message)

        request = Request(scope)
        audited = RequestAudit(
            request.method, request.url.path, request.client.host if request.client else None
        )
        try:
            with open_request(audited):
                refusal = await asyncio.to_thread(self._refusal, request)
                if refusal is not None:
                    await refusal(scope, receive, timed_send)
                else:
                    await self.app(scope, receive, timed_send)
        finally:
            if request.method not in SAFE_METHODS or audited.entries:
                principal = scope.get("state", {}).get("principal")
                who = principal.name if isinstance(principal, Principal) else None
                await self._record(who, audited, status["code"])

    async def _record(self, who: str | None, audited: RequestAudit, code: int) -> None:
        """The request's one entry: the changes it recorded get its status; else an
        entry of the request (without a valid token: counted per source)."""
        try:
            if await asyncio.to_thread(self.audit.finish, audited, code):
                return
            if who is None:
                await asyncio.to_thread(self.audit.unauthenticated, audited, code)
            else:
                await asyncio.to_thread(self.audit.request, who, audited, code)
        except Exception:  # the answer is sent: a failed entry is logged, never raised
            log.exception("writing the audit entry of %s %s failed", audited.method, audited.path)

    def _refusal(self, request: Request) -> Response | None:
        path = request.url.path
        if path in OPEN_PATHS or path.startswith(PUBLIC_PREFIXES):
            return None
        api = path.startswith("/api/") or path == "/metrics"
        token = bearer_value(request.headers.get("authorization"))
        grant = hash_token(token) if token else ""
        principal = self.users.by_grant(grant) if token else None
        via = "bearer"
        if principal is None:
            sid = request.cookies.get(SESSION_COOKIE)
            session = self.sessions.get(sid)
            grant = session.grant if session is not None else ""
            principal = self.users.by_grant(grant) if session is not None else None
            via = "session"
            if session is not None and principal is None:
                self.sessions.end(sid)  # its grant was revoked: the session dies with it
            if (
                session is not None
                and principal is not None
                and api
                and request.method not in SAFE_METHODS
                and not same_token(request.headers.get(CSRF_HEADER), session.csrf)
            ):
                return errors.error_response(
                    403, "csrf", "missing or wrong CSRF token (X-CSRF-Token header)"
                )
        if principal is not None:
            request.state.principal = principal
            request.state.via = via
            request.state.grant = grant  # a live stream re-checks it (auth.credential_alive)
            if (
                api
                and request.method not in SAFE_METHODS
                and not principal.role.at_least(Role.USER)
            ):
                return errors.error_response(
                    403,
                    "forbidden",
                    f"{principal.name} is a viewer: a viewer only reads "
                    f"({request.method} {path} changes state)",
                    {"user": principal.name, "role": principal.role.value, "needed": "user"},
                )
            return None
        if path.startswith("/api/") or path in ("/metrics", "/openapi.json", "/docs"):
            return errors.error_response(
                401,
                "unauthorized",
                "a valid bearer token is required",
                headers={"WWW-Authenticate": "Bearer"},
            )
        return RedirectResponse(f"/login?next={quote(path)}", status_code=303)


def _route_of(request: Request) -> str:
    """The route template (``/api/jobs/{job_id}``), so ids do not explode the labels."""
    chosen = request.scope.get("route")  # the route the router picked (its path has the prefix)
    path = getattr(chosen, "path", None)
    if isinstance(path, str):
        return path
    for route in request.app.router.routes:  # refused before routing: match it here
        match, _ = route.matches(request.scope)
        if match is Match.FULL:
            return str(getattr(route, "path", "other"))
    return "unmatched"


def create_app(
    svc: Services,
    token: str,
    *,
    background: bool = True,
    max_request_bytes: int = MAX_REQUEST_BYTES,
) -> FastAPI:
    """The app over ``svc``; ``background`` runs re-attach, ingest and the scheduler;
    a body over ``max_request_bytes`` is a 413."""
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
            running.append(asyncio.create_task(svc.machines.run_health_checks()))
            running.append(asyncio.create_task(svc.jobs.notifications.run()))
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
        dependencies=[Depends(no_nul_in_path)],
        docs_url=None,  # served from the local Swagger UI (corral.api.docs), no CDN
        redoc_url=None,
    )
    sessions = Sessions()
    app.state.services = svc
    app.state.sessions = sessions
    app.state.token = token
    svc.users.ensure_admin(token)  # the server's token is the user admin's
    # outermost last: headers on every answer, then the token, then the input guard
    app.add_middleware(InputGuard, max_bytes=max_request_bytes)
    app.add_middleware(
        TokenMiddleware, users=svc.users, audit=svc.audit, metrics=metrics, sessions=sessions
    )
    app.add_middleware(SecurityHeaders)
    errors.install(app)
    for module in (network, tasks, queue, jobs, users, notify, compare):
        app.include_router(module.router)
    from corral.web import pages

    app.include_router(pages.router)
    app.mount("/static", pages.static, name="static")
    install_docs(app)

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
