"""Page routes: login/logout and the shells of the machines, new-job, job and jobs
pages. A page carries nothing but its shell and the session's CSRF token: its data
comes from the API, fetched by the page's own script with the session cookie."""

from __future__ import annotations

import json
import secrets
from pathlib import Path
from typing import Annotated, Any
from urllib.parse import urlsplit

from fastapi import APIRouter, Form, Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response
from fastapi.staticfiles import StaticFiles
from fastapi.templating import Jinja2Templates

from corral import __version__
from corral.service.users import Principal, Role, UserService, hash_token
from corral.sessions import LOGIN_COOKIE, SESSION_COOKIE, Session, Sessions, same_token
from corral.states import TERMINAL_STATES, JobState, NodeState
from corral.web.form import option_sections

HERE = Path(__file__).parent
templates = Jinja2Templates(directory=str(HERE / "templates"))
static = StaticFiles(directory=str(HERE / "static"))
router = APIRouter(include_in_schema=False)

SYMBOLS: dict[str, str] = {
    JobState.PLANNED: "○", JobState.QUEUED: "⋯", JobState.PENDING: "…",
    JobState.PREPARING: "…", JobState.STARTING: "▷", JobState.RUNNING: "▶",
    JobState.STOPPING: "■", JobState.RESTARTING: "↻", JobState.SUCCEEDED: "✓",
    JobState.FAILED: "✕", JobState.TIMED_OUT: "⏱", JobState.CANCELLED: "⊘",
    JobState.LOST: "!", NodeState.EXITED: "✓", NodeState.TERMINATED: "■",
}  # fmt: skip
"""The badge symbol of each job and node state (a word and a symbol, never colour alone)."""
STATES_JSON = json.dumps(
    {
        "job": {s.name: s.value for s in JobState},
        "node": {s.name: s.value for s in NodeState},
        "final": sorted(s.value for s in TERMINAL_STATES),
        "nodeFinal": sorted(s.value for s in NodeState if s.terminal),
        "symbols": {str(getattr(k, "value", k)): v for k, v in SYMBOLS.items()},
    },
    separators=(",", ":"),
)
"""The state vocabulary (:mod:`corral.states`) for the pages' scripts: every page's
``<body data-states>``, read by ``corral.js`` as ``corral.STATES``, so no script spells
a state name itself."""


def _sessions(request: Request) -> Sessions:
    found: Sessions = request.app.state.sessions
    return found


def _session(request: Request) -> Session | None:
    return _sessions(request).get(request.cookies.get(SESSION_COOKIE))


def _secure(request: Request) -> bool:
    return request.url.scheme == "https"


def _safe_next(target: str | None) -> str:
    """Only a path on this server (never another site) after login."""
    if not target or not target.startswith("/") or target.startswith("//"):
        return "/"
    parts = urlsplit(target)
    return parts.path if not parts.netloc and not parts.scheme else "/"


def page(request: Request, name: str, title: str, **context: Any) -> Response:
    """Render a page shell for the logged-in session."""
    session = _session(request)
    if session is None:  # the middleware lets bearer clients in: pages need a session
        return RedirectResponse(f"/login?next={request.url.path}", status_code=303)
    who = request.state.principal if hasattr(request.state, "principal") else None
    role = who.role if isinstance(who, Principal) else Role.VIEWER
    # what the page offers: the actions the role may take (the API refuses the rest)
    rights = {
        "user": who.name if isinstance(who, Principal) else "",
        "role": role.value,
        "can_submit": role.at_least(Role.USER),
        "is_admin": role is Role.ADMIN,
    }
    return templates.TemplateResponse(
        request,
        name,
        {
            "title": title,
            "csrf": session.csrf,
            "version": __version__,
            "states": STATES_JSON,
            **rights,
            **context,
        },
    )


@router.get("/login", response_class=HTMLResponse)
def login_form(request: Request, next: str = "/", error: str = "") -> Response:
    # the login form's CSRF nonce: kept while the cookie lives, so a second tab or a
    # background redirect to /login (a favicon request) does not void an open form
    nonce = request.cookies.get(LOGIN_COOKIE) or secrets.token_urlsafe(32)
    response = templates.TemplateResponse(
        request,
        "login.html",
        {
            "title": "Log in",
            "login_csrf": nonce,
            "next": _safe_next(next),
            "error": error,
            "version": __version__,
        },
    )
    response.set_cookie(
        LOGIN_COOKIE,
        nonce,
        httponly=True,
        samesite="strict",
        secure=_secure(request),
        path="/login",
    )
    return response


@router.post("/login")
def login(
    request: Request,
    token: Annotated[str, Form()] = "",
    csrf_token: Annotated[str, Form()] = "",
    next: Annotated[str, Form()] = "/",
) -> Response:
    expected = request.cookies.get(LOGIN_COOKIE) or ""
    if not expected or not same_token(csrf_token, expected):
        return RedirectResponse("/login?error=csrf", status_code=303)
    users: UserService = request.app.state.services.users
    grant = hash_token(token.strip())
    who = users.by_grant(grant) if token.strip() else None
    if who is None:
        return RedirectResponse(f"/login?error=token&next={_safe_next(next)}", status_code=303)
    sid, _ = _sessions(request).create(who.name, grant)
    request.app.state.services.audit.change(who.name, "login", who.name, after={"via": "web"})
    response = RedirectResponse(_safe_next(next), status_code=303)
    response.set_cookie(
        SESSION_COOKIE, sid, httponly=True, samesite="strict", secure=_secure(request), path="/"
    )
    response.delete_cookie(LOGIN_COOKIE, path="/login")
    return response


@router.post("/logout")
def logout(request: Request, csrf_token: Annotated[str, Form()] = "") -> Response:
    session = _session(request)
    if session is None or not same_token(csrf_token, session.csrf):
        return Response("missing or wrong CSRF token", status_code=403)
    _sessions(request).end(request.cookies.get(SESSION_COOKIE))
    response = RedirectResponse("/login", status_code=303)
    response.delete_cookie(SESSION_COOKIE, path="/")
    return response


@router.get("/", response_class=HTMLResponse)
def machines_page(request: Request) -> Response:
    return page(request, "machines.html", "Machines", nav="machines")


@router.get("/jobs/new", response_class=HTMLResponse)
def new_job_page(request: Request) -> Response:
    # the option fields come from JobRequest's schema: the API's names, defaults, bounds
    return page(request, "new_job.html", "New job", nav="new", option_sections=option_sections())


@router.get("/jobs", response_class=HTMLResponse)
def jobs_page(request: Request) -> Response:
    return page(request, "jobs.html", "Jobs and queue", nav="jobs")


@router.get("/queue", response_class=HTMLResponse)
def queue_page(request: Request) -> Response:
    return page(request, "queue.html", "Queue", nav="queue")


@router.get("/audit", response_class=HTMLResponse)
def audit_page(request: Request) -> Response:
    return page(request, "audit.html", "Users and audit log", nav="audit")


@router.get("/users", response_class=HTMLResponse)
def users_page(request: Request) -> Response:
    return page(request, "audit.html", "Users and audit log", nav="audit")


@router.get("/compare", response_class=HTMLResponse)
def compare_page(request: Request) -> Response:
    return page(request, "compare.html", "Compare jobs", nav="jobs")


@router.get("/jobs/{job_id}", response_class=HTMLResponse)
def job_page(request: Request, job_id: str) -> Response:
    return page(request, "job.html", f"Job {job_id}", nav="jobs", job_id=job_id)
