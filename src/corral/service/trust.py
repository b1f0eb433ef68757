"""The team server's trust boundary: what a job of a ``user`` may reach on the server.

The server runs every job's supervisor as its own OS user, next to its token file,
its store and its run dir. So:

- **The server's own host is the admins'.** A job on a ``local`` machine (any
  launcher), ``prepare_dependencies`` and a job that pushes or reads a tree of the
  server's filesystem (``sync``, ``code_dir``) run there as the server's user: an
  admin's only; anyone else gets a 403 saying so. A ``user``'s automatic machine
  selection never picks a local machine. Jobs on SSH machines run there as the
  machine's configured SSH user: that account is the boundary.
- **Tracking targets stay in bounds.** What a target writes on the server (a
  TensorBoard directory, an MLflow ``sqlite:``/``file:`` store) is inside the job's
  own run dir or under a path of the server's allow-list (``corral serve
  --tracking-allow``); a tracking server (``http(s)://``, a database URL) is under a
  URL prefix of that list. Relative paths are relative to the job's run dir. An
  admin is not held to the list (an admin may run anything on the server's host
  anyway), but nobody's target reaches a link-local or cloud metadata address
  unless the list names it.

The supervisor's environment never carries the server's token, token file or
store URL, and what it creates is private to the server's user (umask 077):
:mod:`corral.service.dispatch`.
"""

from __future__ import annotations

import ipaddress
import os
from collections.abc import Sequence
from pathlib import Path
from urllib.parse import urlsplit

from corral.errors import ConfigError, Forbidden
from corral.notify.urls import METADATA_NAMES, classify
from corral.service.models import DistributedJobStatus, Suggestion
from corral.service.users import Principal, UserService
from corral.store import Store
from corral.store.models import Machine
from corral.track.targets import TrackTarget, parse_target, rebased, remote_url, written_path

ALLOW_OPTION = "--tracking-allow"
OUTPUT_KEYS = ("stderr_tail", "log_tail", "traceback")
"""The parts of a job's root cause that are its output (left out for other readers)."""
_DEFAULT_PORTS = {"http": 80, "https": 443}


def owner_principal(store: Store, owner: str | None) -> Principal | None:
    """The active user ``owner`` (None: the server itself planned it, or nobody)."""
    return UserService(store).principal(owner) if owner is not None else None


def is_trusted(store: Store, owner: str | None) -> bool:
    """Whether ``owner``'s jobs may run on the server's own host: an admin, or no owner
    (a job the server made itself). A revoked or unknown owner is not."""
    if owner is None:
        return True
    found = owner_principal(store, owner)
    return found is not None and found.admin


def refuse_server_host(owner: str | None, what: str) -> Forbidden:
    """The 403 of a non-admin reaching the server's own host."""
    return Forbidden(
        f"{what}: that runs on the server's own host as the server's OS user, next to "
        f"its token and store, so only an admin may do it ({owner or 'nobody'} is not an "
        "admin). Run jobs on an SSH machine instead",
        details={"user": owner, "needed": "admin", "rule": "server-host"},
    )


def check_machines(machines: Sequence[Machine], owner: str | None, trusted: bool) -> None:
    """Forbidden when an untrusted owner's job would run on a local machine."""
    local = [m.name for m in machines if m.local]
    if local and not trusted:
        raise refuse_server_host(owner, f"machine {', '.join(local)} is local")


SERVER_HOST_REASON = "on the server's own host: admins only"


def mark_server_host(
    ranked: Sequence[Suggestion], machines: Sequence[Machine], trusted: bool
) -> list[Suggestion]:
    """Machine suggestions as an owner sees them: for one who is not trusted, local
    machines are not eligible (:data:`SERVER_HOST_REASON`), eligible ones first."""
    if trusted:
        return list(ranked)
    local = {m.id for m in machines if m.local}
    out = [
        s.model_copy(update={"eligible": False, "reasons": [SERVER_HOST_REASON]})
        if s.machine_id in local
        else s
        for s in ranked
    ]
    return sorted(out, key=lambda s: not s.eligible)  # stable: the score order stays


def parse_allow(entries: Sequence[str]) -> tuple[str, ...]:
    """The allow-list as given to ``--tracking-allow``: absolute paths (``~``
    expanded, resolved) and URL prefixes (``http://mlflow:5000``); ConfigError
    for anything else."""
    out: list[str] = []
    for entry in entries:
        text = entry.strip()
        if not text or "\0" in text:
            raise ConfigError(f"{entry!r} is not a path or a URL", option=ALLOW_OPTION)
        scheme = urlsplit(text).scheme
        if len(scheme) > 1 and scheme != "file":
            if not urlsplit(text).hostname and scheme in _DEFAULT_PORTS:
                raise ConfigError(f"{text!r}: a URL prefix needs a host", option=ALLOW_OPTION)
            out.append(text)
            continue
        path = text[len("file://") :] if text.startswith("file://") else text
        path = os.path.expanduser(path)
        if not os.path.isabs(path):
            raise ConfigError(
                f"{text!r}: an allowed path must be absolute (relative tracking paths are "
                "in the job's run dir already)",
                option=ALLOW_OPTION,
            )
        out.append(os.path.realpath(path))
    return tuple(out)


def _inside(path: str, root: str) -> bool:
    return Path(path).is_relative_to(root)


def _url_key(url: str) -> tuple[str, str, int | None, str] | None:
    parts = urlsplit(url)
    try:
        port = parts.port
    except ValueError:
        return None
    scheme = parts.scheme.lower()
    host = (parts.hostname or "").lower()
    return scheme, host, port or _DEFAULT_PORTS.get(scheme), parts.path.rstrip("/")


def url_allowed(url: str, allow: Sequence[str]) -> bool:
    """Whether ``url`` is under one of the allow-list's URL prefixes (same scheme, host
    and port, its path at or below the prefix's)."""
    key = _url_key(url)
    if key is None:
        return False
    for entry in allow:
        prefix = _url_key(entry)
        if prefix is None or len(urlsplit(entry).scheme) < 2:
            continue  # a path
        if key[:3] == prefix[:3] and (key[3] == prefix[3] or key[3].startswith(prefix[3] + "/")):
            return True
    return False


def link_local(host: str) -> bool:
    """Whether ``host`` is a link-local address (169.254/16, fe80::/10: where cloud
    metadata services answer), another metadata address or a metadata service's
    well-known name (the notifications' rule: :mod:`corral.notify.urls`)."""
    name = host.strip("[]").lower().rstrip(".")
    if name in METADATA_NAMES:
        return True
    try:
        address = ipaddress.ip_address(name.split("%")[0])
    except ValueError:
        return False
    return classify(address) == "link_local"


def admit_target(text: str, *, job_dir: str, allow: Sequence[str], trusted: bool) -> TrackTarget:
    """The target ``text`` as the job will use it (a relative path made absolute under
    ``job_dir``), or Forbidden naming the target and the rule it breaks."""
    target = rebased(parse_target(text), job_dir)
    path = written_path(target)
    if path is not None:
        real = os.path.realpath(os.path.expanduser(path))
        roots = [os.path.realpath(job_dir), *(a for a in allow if os.path.isabs(a))]
        if trusted or any(_inside(real, root) for root in roots):
            return target
        raise Forbidden(
            f"track {text!r}: it would write {real} on the server, which is neither in the "
            f"job's run dir nor under a path the server allows (corral serve {ALLOW_OPTION}); "
            "give a relative path (it lands in the job's run dir) or ask an admin to allow "
            "the place",
            details={"field": "track", "target": text, "rule": "tracking-allow-list"},
        )
    url = remote_url(target)
    if url is None:
        return target  # W&B (in the job's run dir) or in-memory SQLite
    allowed = url_allowed(url, allow)
    host = urlsplit(url).hostname or ""
    if host and link_local(host) and not allowed:
        raise Forbidden(
            f"track {text!r}: {host} is a link-local or cloud metadata address, which no "
            f"job's tracking may reach unless the server allows it ({ALLOW_OPTION})",
            details={"field": "track", "target": text, "rule": "link-local"},
        )
    if trusted or allowed:
        return target
    raise Forbidden(
        f"track {text!r}: the tracking server is not one the server allows (corral serve "
        f"{ALLOW_OPTION} URL_PREFIX); ask an admin to allow it",
        details={"field": "track", "target": text, "rule": "tracking-allow-list"},
    )


def admit_tracking(
    track: Sequence[str], *, job_dir: str, allow: Sequence[str], trusted: bool
) -> tuple[str, ...]:
    """Every target admitted (:func:`admit_target`), as the job will use them."""
    return tuple(str(admit_target(t, job_dir=job_dir, allow=allow, trusted=trusted)) for t in track)


def check_server_paths(
    sync: bool,
    code_dir: str | None,
    calibration: str | None,
    run_dir: Path,
    owner: str | None,
) -> None:
    """Forbidden for an untrusted owner's job that pushes or reads a tree of the
    server's own filesystem (``sync``, ``code_dir``) or a file of it outside the
    server's run dir (``calibration``: ``corral calibrate`` saves there)."""
    if sync:
        raise refuse_server_host(owner, "sync pushes a tree of the server's own filesystem")
    if code_dir is not None:
        raise refuse_server_host(owner, "code_dir reads a tree of the server's own filesystem")
    if calibration is not None:
        real = os.path.realpath(os.path.expanduser(calibration))
        if not _inside(real, os.path.realpath(run_dir)):
            raise refuse_server_host(
                owner, "calibration reads a file of the server's own filesystem outside its run dir"
            )


def shown_status(status: DistributedJobStatus, who: Principal) -> DistributedJobStatus:
    """A job's status as ``who`` sees it: whole for its owner and admins; for anyone
    else without the lines of output its root cause quotes (stderr, log, traceback)."""
    cause = status.root_cause
    if who.may_read_output(status.owner) or not cause:
        return status
    kept = {k: v for k, v in cause.items() if k not in OUTPUT_KEYS}
    return status.model_copy(update={"root_cause": kept})
