"""``--track BACKEND:WHERE``: the experiment trackers a job's reports go to.

``mlflow:URI`` (a tracking URI: ``sqlite:///mlflow.db``, ``file:./mlruns``,
``http://host:5000``), ``tensorboard:DIR`` (event files in ``DIR/<job id>``) and
``wandb:PROJECT`` (or ``ENTITY/PROJECT``; offline unless ``WANDB_MODE`` says
otherwise). Each backend is an optional extra of corral; :class:`TrackPolicy`
validates the targets when a job is built, before anything is launched, so a
typo or a missing extra is one clear error naming the option (and the extra).
"""

from __future__ import annotations

import importlib.util
import os
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Literal, cast
from urllib.parse import quote, unquote, urlsplit

from corral.errors import ConfigError

Backend = Literal["mlflow", "tensorboard", "wandb"]

OPTION = "--track"

BACKENDS: dict[str, tuple[str, str]] = {
    "mlflow": ("mlflow", "mlflow"),
    "tensorboard": ("tensorboard", "tensorboard"),
    "wandb": ("wandb", "wandb"),
}
"""Backend -> (the module it imports, the extra of corral that installs it)."""

MAX_TARGETS = 8


@dataclass(frozen=True)
class TrackTarget:
    """One parsed ``--track`` value."""

    backend: Backend
    where: str  # the MLflow tracking URI, the TensorBoard directory or the W&B project

    def __str__(self) -> str:
        return f"{self.backend}:{self.where}"


def parse_target(text: str) -> TrackTarget:
    """``BACKEND:WHERE`` as a :class:`TrackTarget` (ConfigError naming ``--track``)."""
    backend, sep, where = text.strip().partition(":")
    if not sep or backend not in BACKENDS:
        raise ConfigError(
            f"{text!r} is not BACKEND:WHERE with BACKEND one of {', '.join(BACKENDS)} "
            "(e.g. mlflow:sqlite:///mlflow.db, tensorboard:runs/tb, wandb:my-project)",
            option=OPTION,
        )
    where = where.strip()
    if not where or "\0" in where:
        raise ConfigError(f"{backend}: needs a location after {backend}:", option=OPTION)
    if backend == "mlflow" and urlsplit(where).password is not None:
        raise ConfigError(
            "mlflow: no password in the tracking URI (it would be stored and shown); "
            "set MLFLOW_TRACKING_USERNAME / MLFLOW_TRACKING_PASSWORD instead",
            option=OPTION,
        )
    if backend == "wandb" and (where.count("/") > 1 or any(c.isspace() for c in where)):
        raise ConfigError(f"wandb: {where!r} is not PROJECT or ENTITY/PROJECT", option=OPTION)
    return TrackTarget(cast(Backend, backend), where)


REMOTE_WORDS = frozenset({"databricks", "databricks-uc", "uc"})
"""MLflow tracking URIs without a scheme that name a remote service, not a path."""


def _sqlite_path(where: str) -> str | None:
    """The file of an MLflow ``sqlite:`` URI as SQLAlchemy opens it (``sqlite:///rel.db``,
    ``sqlite:////abs.db``, ``sqlite://HOST//abs.db``: the host is ignored; the path
    percent-decoded); None for an in-memory database (``sqlite://``, ``:memory:``)."""
    rest = where[len("sqlite:") :]
    if not rest.startswith("//"):
        return None  # not a URL SQLAlchemy opens: nothing written
    path = unquote(rest[2:].partition("/")[2].partition("?")[0])
    return path if path and path != ":memory:" else None


def written_path(target: TrackTarget) -> str | None:
    """The file or directory a target writes on the coordinator, as given (maybe
    relative): a TensorBoard directory, an MLflow ``sqlite:``/``file:`` store or plain
    path; None for a tracking server (a URL), W&B (its run dir) or in-memory SQLite."""
    if target.backend == "tensorboard":
        return target.where
    if target.backend != "mlflow":
        return None
    where = target.where
    scheme = urlsplit(where).scheme.lower()
    if scheme == "sqlite":
        return _sqlite_path(where)
    if scheme == "file":
        rest = where[len("file:") :]
        if rest.startswith("//"):
            rest = "/" + rest[2:].partition("/")[2]  # file://HOST/path: the path
        # what MLflow opens: the path percent-decoded (file:///j/%2e%2e is /j/..)
        return unquote(rest.partition("?")[0].partition("#")[0]) or "."
    if scheme and len(scheme) > 1:  # http:, postgresql:, databricks: ... (C: is a drive)
        return None
    if where in REMOTE_WORDS:
        return None
    return where


def remote_url(target: TrackTarget) -> str | None:
    """The tracking server an MLflow target talks to (``http://host:5000``,
    ``postgresql://host/db``, ``databricks``); None for what is written locally."""
    if target.backend != "mlflow" or written_path(target) is not None:
        return None
    if target.where.lower().startswith("sqlite:"):
        return None  # in-memory
    return target.where


def rebased(target: TrackTarget, base: str) -> TrackTarget:
    """``target`` with a relative path it writes made absolute under ``base``."""
    path = written_path(target)
    if path is None or os.path.isabs(os.path.expanduser(path)):
        return target
    absolute = os.path.normpath(os.path.join(base, path))
    if target.backend == "tensorboard":
        return replace(target, where=absolute)
    scheme = urlsplit(target.where).scheme.lower()
    if scheme == "sqlite":  # quoted: SQLAlchemy decodes it back to ``absolute``
        query = target.where.partition("?")[2]
        where = f"sqlite:///{quote(absolute)}" + (f"?{query}" if query else "")
        return replace(target, where=where)
    if scheme == "file":  # quoted: MLflow decodes it back to ``absolute``
        return replace(target, where=f"file://{quote(absolute)}")
    return replace(target, where=absolute)


def installed(module: str) -> bool:
    """Whether ``module`` can be imported here (without importing it)."""
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False


def check_installed(backend: Backend) -> None:
    """ConfigError naming the extra to install when ``backend``'s package is missing."""
    module, extra = BACKENDS[backend]
    if not installed(module):
        raise ConfigError(
            f"{backend} tracking needs the {module!r} package, which is not installed: "
            f"pip install 'corral[{extra}]'",
            option=OPTION,
        )


def parse_targets(texts: Sequence[str]) -> tuple[TrackTarget, ...]:
    """Every ``--track`` value parsed and its backend checked installed; a target given
    twice is an error."""
    if len(texts) > MAX_TARGETS:
        raise ConfigError(f"at most {MAX_TARGETS} trackers (got {len(texts)})", option=OPTION)
    targets: list[TrackTarget] = []
    for text in texts:
        target = parse_target(text)
        if target in targets:
            raise ConfigError(f"{target} is given twice", option=OPTION)
        check_installed(target.backend)
        targets.append(target)
    return tuple(targets)


@dataclass(frozen=True)
class TrackPolicy:
    """Where the job's reports, parameters and final state are forwarded (``--track``,
    repeatable); validated on construction."""

    track: tuple[str, ...] = ()
    name: str | None = None
    """The job's name (a tracker's run is named after it; None: after the job id)."""
    owner: str | None = None
    """Who submitted the job (None: the user running the supervisor)."""

    def __post_init__(self) -> None:
        parse_targets(self.track)

    @property
    def targets(self) -> tuple[TrackTarget, ...]:
        """The parsed targets."""
        return tuple(parse_target(t) for t in self.track)
