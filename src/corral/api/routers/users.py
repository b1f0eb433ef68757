"""``/api/users`` (admin): add, list, revoke users and set their limits;
``/api/me``: who the caller is; ``/api/audit`` (admin): the audit log."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Depends, Query, Security

from corral.api.auth import Caller, bearer, require_admin
from corral.api.routers.network import ERRORS
from corral.api.services import Services, services
from corral.service.audit import AuditPage
from corral.service.users import LimitsIn, Principal, UserCreated, UserIn, UserOut

FORBIDDEN: dict[int | str, dict[str, Any]] = {
    **ERRORS,
    403: {"description": "The caller's role may not do this (names the role needed)."},
}
router = APIRouter(prefix="/api", tags=["users"], dependencies=[Security(bearer)])
admin = APIRouter(
    tags=["users"],
    dependencies=[Security(bearer), Depends(require_admin)],
    responses=FORBIDDEN,
)
Svc = Annotated[Services, Depends(services)]


@router.get("/me", summary="The caller: their name and role")
def me(who: Caller) -> dict[str, str]:
    return _me(who)


def _me(who: Principal) -> dict[str, str]:
    return {"name": who.name, "role": who.role.value}


@admin.get("/users", summary="Every user (revoked ones included); never a token")
def list_users(svc: Svc) -> list[UserOut]:
    return svc.users.list_users()


@admin.post(
    "/users",
    status_code=201,
    summary="Add a user: the answer holds their token, shown this once",
    description="A revoked user's name may be added again (a new token and role).",
)
def add_user(body: UserIn, svc: Svc, who: Caller) -> UserCreated:
    return svc.users.add(body, by=who.name)


@admin.delete("/users/{name}", summary="Revoke a user's token (their jobs stay theirs)")
def revoke_user(name: str, svc: Svc, who: Caller) -> UserOut:
    return svc.users.revoke(name, by=who.name)


@admin.put(
    "/users/{name}/limits",
    summary="Limit the user's running jobs, the machines they hold, their queued jobs",
    description="Only the limits given change. `jobs`, `machines`: null is no limit; "
    "`queued`: null is the server's `--max-queued`.",
)
def set_limits(name: str, body: LimitsIn, svc: Svc, who: Caller) -> UserOut:
    return svc.users.set_limits(name, body, by=who.name)


@admin.get(
    "/audit",
    summary="The audit log, newest first: who changed what, before and after",
    description="One entry per privileged change (`action`, `target`, `before`, `after`) "
    "or other state-changing request; requests without a valid token are one entry per "
    "source address and minute with their `count`.",
)
def audit(
    svc: Svc,
    user: Annotated[str | None, Query(max_length=64)] = None,
    limit: Annotated[int, Query(ge=1, le=1000)] = 50,
    offset: Annotated[int, Query(ge=0, le=2**31)] = 0,
) -> AuditPage:
    return svc.audit.page(user=user, limit=limit, offset=offset)


router.include_router(admin)
