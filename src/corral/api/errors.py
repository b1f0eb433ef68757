"""One JSON error shape for every failure: ``{"error": {"type", "message", "details"}}``.

Mapped from corral's error tree, which knows no HTTP: :data:`STATUS` gives a
:class:`~corral.errors.ServiceError` its status (404, 403, 409, 422, else 400); a
:class:`~corral.errors.ConfigError` is a 422 naming the option; a
:class:`~corral.errors.CheckFailed` a 409 with the failing checks; a transport
error a 502 naming the host; an invalid body a 422 naming each field.
A value the database refuses is a 422 (logged without the value). Anything
unexpected is a 500 with no traceback (it is logged on the server, without the
statement's parameters).
"""

from __future__ import annotations

import logging
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from sqlalchemy.exc import DataError, DBAPIError
from starlette.exceptions import HTTPException

from corral.errors import (
    CheckFailed,
    ConfigError,
    Conflict,
    CorralError,
    Forbidden,
    Invalid,
    NotFound,
    ServiceError,
    TooMany,
    TransportError,
)

log = logging.getLogger("corral.serve")

#: The HTTP status of each refusal of the service layer (a subclass: its nearest base's).
STATUS: dict[type[ServiceError], int] = {
    NotFound: 404,
    Forbidden: 403,
    Conflict: 409,
    Invalid: 422,
    TooMany: 429,
    ServiceError: 400,
}


def status_of(exc: ServiceError) -> int:
    """The HTTP status of ``exc``: :data:`STATUS` of its class or nearest base."""
    for cls in type(exc).__mro__:
        if cls in STATUS:
            return STATUS[cls]
    return 400


def error_body(kind: str, message: str, details: Any = None) -> dict[str, Any]:
    """The one error shape."""
    return {"error": {"type": kind, "message": message, "details": details or {}}}


def error_response(
    status: int, kind: str, message: str, details: Any = None, headers: dict[str, str] | None = None
) -> JSONResponse:
    """A JSON error response."""
    return JSONResponse(error_body(kind, message, details), status_code=status, headers=headers)


def corral_error(exc: CorralError) -> JSONResponse:
    """The response for an error of corral's tree."""
    if isinstance(exc, ServiceError):
        return error_response(status_of(exc), exc.type, exc.message, exc.info)
    if isinstance(exc, ConfigError):
        return error_response(422, "invalid", str(exc), {"option": exc.option})
    if isinstance(exc, CheckFailed):
        return error_response(409, "check_failed", str(exc), {"details": exc.details()})
    if isinstance(exc, TransportError):
        return error_response(502, "unreachable", str(exc), {"host": getattr(exc, "host", None)})
    return error_response(400, type(exc).__name__, str(exc), {"details": exc.details()})


def install(app: FastAPI) -> None:
    """Register the handlers on ``app``."""

    @app.exception_handler(CorralError)
    async def _corral(_: Request, exc: CorralError) -> JSONResponse:
        return corral_error(exc)

    @app.exception_handler(RequestValidationError)
    async def _invalid(_: Request, exc: RequestValidationError) -> JSONResponse:
        fields = []
        for err in exc.errors():
            loc = [str(p) for p in err.get("loc", ())]
            fields.append({"field": ".".join(loc), "message": err.get("msg", "")})
        first = fields[0] if fields else {"field": "", "message": "invalid request"}
        message = f"{first['field']}: {first['message']}" if first["field"] else first["message"]
        return error_response(422, "invalid", message, {"fields": fields})

    @app.exception_handler(HTTPException)
    async def _http(_: Request, exc: HTTPException) -> JSONResponse:
        kind = {401: "unauthorized", 404: "not_found", 405: "method_not_allowed"}.get(
            exc.status_code, "http_error"
        )
        return error_response(
            exc.status_code, kind, str(exc.detail), headers=getattr(exc, "headers", None)
        )

    @app.exception_handler(DataError)
    async def _data(request: Request, exc: DataError) -> JSONResponse:
        # a value the database refuses that validation let through: the request's
        # fault, and the message (which may quote the value) is not logged
        log.warning(
            "%s %s: the database refused a value (%s)",
            request.method,
            request.url.path,
            type(exc.orig).__name__,
        )
        return error_response(422, "invalid", "a value of the request is not storable")

    @app.exception_handler(Exception)
    async def _unexpected(request: Request, exc: Exception) -> JSONResponse:
        if isinstance(exc, DBAPIError):  # the driver's message may quote a request's value
            log.error(
                "unexpected database error in %s %s: %s in %s",
                request.method,
                request.url.path,
                type(exc.orig).__name__,
                (exc.statement or "").split("\n", 1)[0][:200],
            )
        else:
            log.exception("unexpected error in %s %s", request.method, request.url.path)
        return error_response(500, "internal", f"internal error: {type(exc).__name__}")
