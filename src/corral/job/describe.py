"""The one job description: what to run (:class:`JobOptions`, the options' one schema,
defined in :mod:`corral.job.schema`), where
(the :class:`~corral.cluster.model.Cluster`) and how its hosts are reached
(:class:`~corral.transport.options.SshOptions`), as one serialisable, versioned value.

Every entry point describes a job this way and builds it with
:func:`~corral.job.build.build_job`: ``corral run`` from its flags, the server's
planner from an API request (the stored plan is this description's JSON) and the
supervisor process from the description it is handed, as is.

The JSON is an envelope ``{"version": 1, "options": ..., "cluster": ..., "ssh": ...,
"withheld": [...]}``. Secret env values (:func:`corral.redact.is_secret`) are never
in it: their *names* are listed in ``withheld`` and the values travel beside it
(:meth:`JobDescription.secrets`, given back to :meth:`JobDescription.from_json`). A
description loaded without them says so (:attr:`JobDescription.withheld`) and
:meth:`JobDescription.complete` refuses it. Another ``version`` is refused with the
versions this corral reads.

A leaf of the engine: pydantic, the standard library and value modules (the
cluster, the SSH options, the defaults) only, so a program that reads or writes
descriptions loads none of the engine (agents, checks, recovery, sync, transports).
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import cache
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, Literal

from corral.cluster.model import Cluster
from corral.errors import ConfigError
from corral.job.schema import JobOptions
from corral.redact import secret_keys
from corral.transport.options import SshOptions

if TYPE_CHECKING:
    from pydantic import BaseModel, ValidationError

VERSION = 1
"""The description format this corral writes (and the only one it reads)."""

SOURCE = "job description"
"""How errors of a description name their source."""


@dataclass(frozen=True)
class JobDescription:
    """One job: its options, its hosts (node 0 first) and how they are reached."""

    options: JobOptions
    cluster: Cluster
    ssh: SshOptions = field(default_factory=SshOptions)
    withheld: tuple[str, ...] = ()
    """Secret env keys whose values this description lacks (loaded without them)."""

    def secret_keys(self) -> list[str]:
        """The env keys of the options that are secret (their values never serialised)."""
        return secret_keys(self.options.env, self.options.secret_env)

    def secrets(self) -> dict[str, str]:
        """The secret env values, to hand over beside :meth:`to_json`."""
        return {k: self.options.env[k] for k in self.secret_keys()}

    def to_dict(self) -> dict[str, Any]:
        """The versioned envelope as plain JSON values, secret env values left out."""
        secret = set(self.secret_keys())
        options = dataclasses.replace(
            self.options, env={k: v for k, v in self.options.env.items() if k not in secret}
        )
        envelope = _envelope()(
            version=VERSION,
            options=options,
            cluster=self.cluster,
            ssh=self.ssh,
            withheld=sorted(secret | set(self.withheld)),
        )
        data: dict[str, Any] = envelope.model_dump(mode="json", fallback=_plain, warnings=False)
        return data

    def to_json(self) -> str:
        """:meth:`to_dict` as JSON text."""
        return json.dumps(self.to_dict(), separators=(",", ":"))

    @classmethod
    def from_dict(cls, data: object, secrets: Mapping[str, str] | None = None) -> JobDescription:
        """The description of an envelope (:meth:`to_dict`), with the withheld secret
        values taken from ``secrets`` when given. ConfigError for another version or
        a malformed envelope, naming the field."""
        if not isinstance(data, Mapping):
            raise ConfigError("is not a JSON object", source=SOURCE)
        version = data.get("version")
        if version != VERSION:
            raise ConfigError(
                f"version {version!r} is not one this corral reads (it reads version "
                f"{VERSION}): describe the job again with this corral",
                source=SOURCE,
            )
        from pydantic import ValidationError

        try:
            envelope: Any = _envelope().model_validate(data)
        except ValidationError as exc:
            raise ConfigError(_first_error(exc), source=SOURCE) from exc
        options = _tuples(envelope.options)
        given = dict(secrets or {})
        missing = tuple(k for k in envelope.withheld if k not in given)
        env = {**options.env, **{k: given[k] for k in envelope.withheld if k in given}}
        return cls(
            options=dataclasses.replace(options, env=env),
            cluster=envelope.cluster,
            ssh=envelope.ssh,
            withheld=missing,
        )

    @classmethod
    def from_json(
        cls, text: str | bytes, secrets: Mapping[str, str] | None = None
    ) -> JobDescription:
        """:meth:`from_dict` of JSON text (ConfigError when it is not JSON)."""
        try:
            data = json.loads(text)
        except ValueError as exc:
            raise ConfigError(f"is not JSON: {exc}", source=SOURCE) from exc
        return cls.from_dict(data, secrets)

    def complete(self) -> JobDescription:
        """This description, when it has every secret value (ConfigError naming the
        withheld ones it lacks)."""
        if self.withheld:
            raise ConfigError(
                f"the values of the secret env {', '.join(self.withheld)} were not given "
                "with the description",
                source=SOURCE,
            )
        return self


@cache
def _envelope() -> type[BaseModel]:
    """The serialised form (unknown fields refused, here and in the dataclasses); built
    on first use, so that a launch loads pydantic only once its nodes are started."""
    from pydantic import BaseModel, ConfigDict

    class _Envelope(BaseModel):
        model_config = ConfigDict(extra="forbid", frozen=True)

        version: Literal[1]
        options: JobOptions
        cluster: Cluster
        ssh: SshOptions = SshOptions()
        withheld: list[str] = []

    return _Envelope


def _plain(value: Any) -> Any:
    """JSON for what pydantic does not serialise itself (the hosts' frozen mappings)."""
    if isinstance(value, MappingProxyType):
        return dict(value)
    raise TypeError(f"cannot serialise {type(value).__name__}")


def _tuples(options: JobOptions) -> JobOptions:
    """``options`` with its sequences as tuples, as a JobOptions is written in code."""
    changes: dict[str, Any] = {
        f.name: tuple(getattr(options, f.name))
        for f in dataclasses.fields(options)
        if isinstance(getattr(options, f.name), list)
    }
    return dataclasses.replace(options, **changes) if changes else options


def _first_error(exc: ValidationError) -> str:
    """The first validation error as ``field.path: message``."""
    error = exc.errors()[0]
    where = ".".join(str(p) for p in error["loc"])
    return f"{where}: {error['msg']}" if where else str(error["msg"])


def describe(
    options: JobOptions, cluster: Cluster, ssh: SshOptions | None = None
) -> JobDescription:
    """The description of ``options`` run on ``cluster`` (``ssh``: how to reach it)."""
    return JobDescription(options=options, cluster=cluster, ssh=ssh or SshOptions())


__all__ = ["SOURCE", "VERSION", "JobDescription", "JobOptions", "describe"]
