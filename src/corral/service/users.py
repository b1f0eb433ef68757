"""Users of ``corral serve``: roles, tokens (stored only as their sha256), limits.

Three roles: a ``viewer`` reads; a ``user`` also submits, queues, stops and deletes
their own jobs and tasks; an ``admin`` also manages machines, users, webhooks,
preferences and every job. A token is 32 random bytes (256 bits), shown once when
the user is added; the store keeps its sha256 only, and a presented token is looked
up by its hash and compared in constant time. A revoked user keeps their row (their
jobs and audit entries name them) but none of their tokens is accepted.

The server's own token (``corral serve --print-token``, the token file) is the
token of the user ``admin``: :meth:`UserService.ensure_admin` makes it so on every
start, so a store from before users existed gets its first admin from that file.
"""

from __future__ import annotations

import enum
import hashlib
import hmac
import re
import secrets
import time
from dataclasses import dataclass

from pydantic import BaseModel, Field
from sqlalchemy import select

from corral.errors import Conflict, Forbidden, Invalid, NotFound
from corral.service.audit import record_change
from corral.store import Store
from corral.store.models import User

ADMIN = "admin"
"""The user whose token is the server's token file."""
NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$"


class Role(str, enum.Enum):
    """What a user may do; each role may do everything of the ones before it."""

    VIEWER = "viewer"
    USER = "user"
    ADMIN = "admin"

    def at_least(self, other: Role) -> bool:
        """Whether this role may do what ``other`` may."""
        order = list(Role)
        return order.index(self) >= order.index(other)


@dataclass(frozen=True)
class Principal:
    """Who made a request."""

    name: str
    role: Role

    @property
    def admin(self) -> bool:
        """Whether they may act on everything."""
        return self.role is Role.ADMIN

    def require(self, role: Role, what: str) -> None:
        """Forbidden unless their role is at least ``role``."""
        if not self.role.at_least(role):
            raise Forbidden(
                f"{what} needs the role {role.value}; {self.name} is a {self.role.value}",
                details={"user": self.name, "role": self.role.value, "needed": role.value},
            )

    def may_prioritise(self, priority: int | None) -> None:
        """Forbidden when a non-admin asks for a priority above the default 0 (only an
        admin puts a job ahead of others; anyone may put theirs behind)."""
        if priority is not None and priority > 0 and not self.admin:
            raise Forbidden(
                f"a priority above 0 needs the role admin; {self.name} is a {self.role.value}",
                details={"field": "priority", "user": self.name, "needed": Role.ADMIN.value},
            )

    def require_owner(self, owner: str | None, what: str) -> None:
        """Forbidden unless they own the thing (``owner``) or are an admin."""
        self.require(Role.USER, what)
        if not self.admin and owner != self.name:
            raise Forbidden(
                f"{what}: it belongs to {owner or 'nobody'}, and only its owner or an "
                f"admin may do that ({self.name} is a {self.role.value})",
                details={"user": self.name, "owner": owner},
            )

    def may_read_output(self, owner: str | None) -> bool:
        """Whether they may read a job's output (its log lines, its run dir's files):
        its owner and admins only; everyone reads every job's state."""
        return self.admin or (owner is not None and owner == self.name)

    def require_reader(self, owner: str | None, what: str) -> None:
        """Forbidden unless they may read the output of a job of ``owner``."""
        if not self.may_read_output(owner):
            raise Forbidden(
                f"{what}: a job's output is for its owner ({owner or 'nobody'}) and "
                f"admins only ({self.name} is a {self.role.value})",
                details={"user": self.name, "owner": owner, "needed": "owner or admin"},
            )


class UserIn(BaseModel):
    """A user to add."""

    name: str = Field(pattern=NAME_PATTERN, description="Letters, digits, '.', '_', '-'.")
    role: Role = Role.USER


class LimitsIn(BaseModel):
    """A user's limits: running jobs and the machines those hold (null: no limit), and
    queued jobs (null: the server's ``--max-queued``). Only the fields given change."""

    jobs: int | None = Field(default=None, ge=0, le=1_000_000)
    machines: int | None = Field(default=None, ge=0, le=1_000_000)
    queued: int | None = Field(default=None, ge=0, le=1_000_000)


class UserOut(BaseModel):
    """A user (never their token)."""

    name: str
    role: Role
    created: float
    revoked: float | None
    max_jobs: int | None
    max_machines: int | None
    max_queued: int | None = None


class UserCreated(UserOut):
    """A new user and their token, shown this once."""

    token: str


def hash_token(token: str) -> str:
    """The sha256 (hex) under which a token is stored."""
    return hashlib.sha256(token.encode()).hexdigest()


def new_token() -> str:
    """A fresh 256-bit token."""
    return secrets.token_urlsafe(32)


def _out(row: User) -> UserOut:
    return UserOut(
        name=row.name,
        role=Role(row.role),
        created=row.created,
        revoked=row.revoked,
        max_jobs=row.max_jobs,
        max_machines=row.max_machines,
        max_queued=row.max_queued,
    )


LIMIT_COLUMNS = {"jobs": "max_jobs", "machines": "max_machines", "queued": "max_queued"}
"""Each field of :class:`LimitsIn` and the user's column it sets."""


def _limits(row: User) -> dict[str, int | None]:
    return {field: getattr(row, column) for field, column in LIMIT_COLUMNS.items()}


class UserService:
    """Users over the store."""

    def __init__(self, store: Store) -> None:
        self.store = store

    def ensure_admin(self, token: str) -> None:
        """Make ``token`` the token of the admin user ``admin`` (added when missing)."""
        digest = hash_token(token)
        with self.store.session() as s:
            row = s.get(User, ADMIN)
            if row is None:
                s.add(
                    User(name=ADMIN, role=Role.ADMIN.value, token_hash=digest, created=time.time())
                )
            elif row.token_hash != digest or row.role != Role.ADMIN.value or row.revoked:
                row.token_hash, row.role, row.revoked = digest, Role.ADMIN.value, None

    def authenticate(self, token: str | None) -> Principal | None:
        """Who holds ``token`` (None: nobody, or a revoked user)."""
        if not token:
            return None
        return self.by_grant(hash_token(token))

    def by_grant(self, digest: str) -> Principal | None:
        """Who holds the token whose stored hash is ``digest`` (None: nobody now: the
        user was revoked or given a new token since). A web session is bound to the
        grant it was made from, so it dies with it (a re-added name is a new grant)."""
        with self.store.session() as s:
            row = s.scalar(select(User).where(User.token_hash == digest))
        if row is None or row.revoked is not None:
            return None
        if not hmac.compare_digest(row.token_hash.encode(), digest.encode()):
            return None
        return Principal(row.name, Role(row.role))

    def principal(self, name: str) -> Principal | None:
        """The active user ``name`` (None: unknown or revoked)."""
        with self.store.session() as s:
            row = s.get(User, name)
        if row is None or row.revoked is not None:
            return None
        return Principal(row.name, Role(row.role))

    def add(self, body: UserIn, *, by: str) -> UserCreated:
        """Add a user (or give a revoked one a new role and token): their token, once.
        Audited as ``by``'s change."""
        token = new_token()
        with self.store.session() as s:
            row = s.get(User, body.name)
            if row is not None and row.revoked is None:
                raise Conflict(
                    f"a user {body.name!r} exists: revoke it first to give it a new token",
                    details={"name": body.name},
                )
            before = None if row is None else {"role": row.role, "revoked": row.revoked}
            if row is None:
                row = User(name=body.name, created=time.time())
                s.add(row)
            row.role, row.token_hash, row.revoked = body.role.value, hash_token(token), None
            s.flush()
            out = _out(row)
            after = {"role": row.role, "revoked": None}
            record_change(s, by, "user.add", body.name, before=before, after=after)
        return UserCreated(**out.model_dump(), token=token)

    def list_users(self) -> list[UserOut]:
        """Every user, revoked ones included, by name."""
        with self.store.session() as s:
            return [_out(r) for r in s.scalars(select(User).order_by(User.name))]

    def get(self, name: str) -> UserOut:
        """One user (NotFound when unknown)."""
        with self.store.session() as s:
            row = s.get(User, name)
            if row is None:
                raise NotFound(f"no user {name!r}", details={"name": name})
            return _out(row)

    def revoke(self, name: str, *, by: str) -> UserOut:
        """Revoke a user's token (the server's own admin cannot be revoked); audited
        as ``by``'s change."""
        if name == ADMIN:
            raise Invalid(
                f"{ADMIN!r} holds the server's own token (corral serve --print-token): "
                "delete the token file and restart the server to replace it",
                details={"name": name},
            )
        with self.store.session() as s:
            row = s.get(User, name)
            if row is None:
                raise NotFound(f"no user {name!r}", details={"name": name})
            if row.revoked is None:
                row.revoked = time.time()
                # a hash nobody's token has, so the old token is dead even if un-revoked
                row.token_hash = "revoked:" + secrets.token_hex(24)
                record_change(
                    s,
                    by,
                    "user.revoke",
                    name,
                    before={"role": row.role, "revoked": None},
                    after={"role": row.role, "revoked": row.revoked},
                )
            return _out(row)

    def set_limits(self, name: str, body: LimitsIn, *, by: str) -> UserOut:
        """Set the limits given in ``body`` (the others stay as they are); audited as
        ``by``'s change, with the limits before and after."""
        with self.store.session() as s:
            row = s.get(User, name)
            if row is None:
                raise NotFound(f"no user {name!r}", details={"name": name})
            before = _limits(row)
            for given in body.model_fields_set:
                setattr(row, LIMIT_COLUMNS[given], getattr(body, given))
            record_change(s, by, "user.limit", name, before=before, after=_limits(row))
            return _out(row)

    def limits(self, name: str | None) -> tuple[int | None, int | None]:
        """The user's (jobs, machines) limits; (None, None) for an unknown owner."""
        if name is None:
            return None, None
        with self.store.session() as s:
            row = s.get(User, name)
        return (row.max_jobs, row.max_machines) if row else (None, None)

    def all_limits(self) -> dict[str, tuple[int | None, int | None]]:
        """The (jobs, machines) limits of every user that has one."""
        with self.store.session() as s:
            rows = s.execute(
                select(User.name, User.max_jobs, User.max_machines).where(
                    (User.max_jobs.is_not(None)) | (User.max_machines.is_not(None))
                )
            ).all()
        return {name: (jobs, machines) for name, jobs, machines in rows}

    def queued_cap(self, name: str | None, default: int) -> int | None:
        """How many jobs ``name`` may have queued: their own cap, else ``default``
        (None: no cap, for a job without an owner)."""
        if name is None:
            return None
        with self.store.session() as s:
            own = s.scalar(select(User.max_queued).where(User.name == name))
        return default if own is None else int(own)


def valid_name(name: str) -> str:
    """``name`` when it is a valid user name; else Invalid naming the rule."""
    if not re.match(NAME_PATTERN, name):
        raise Invalid(
            f"invalid user name {name!r}: letters, digits, '.', '_', '-' (at most 64, "
            "not starting with a punctuation mark)",
            details={"field": "name"},
        )
    return name
