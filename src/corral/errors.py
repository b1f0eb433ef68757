"""The one exception tree of corral.

Every expected failure is a :class:`CorralError`. The CLI prints one clear line
per error (details with ``-v``) and never a traceback for these. Errors raised
at the transport edge wrap the library error with ``raise ... from exc``.

```
CorralError
├── ConfigError            bad hostfile/options; names file:line or option
├── TransportError         host, command
│   ├── ConnectError       unreachable, refused, auth failed, host key mismatch
│   ├── CommandTimeout
│   └── ConnectionLost
├── CheckFailed            list of failing CheckResults with fix commands
├── LaunchError
│   └── ActorStartError    actors: the workers that did not start, each with its cause
├── JobFailed              root cause: host, rank, exit code/signal, stderr tail
├── ClientError            corral.client: talking to corral serve failed; the server's URL
│   ├── ServerUnreachable  refused, timed out, connection cut
│   └── TokenRefused       the server refused the token (missing or wrong)
├── ActorError             actors (corral.actors.errors): host, rank of one worker
│   ├── WorkerDied         exit code or signal, stderr tail (a lost host too)
│   │   └── WorkerRestarted  ... and was started again (max_restarts)
│   ├── RemoteError        work_fn raised: remote type, message and traceback
│   ├── ActorTimeout       recv(timeout=) or a group operation's timeout ran out
│   └── ActorGroupError    broadcast/gather/call: one error per worker that failed
└── ServiceError           a request corral serve refuses: type, details
    ├── NotFound           unknown machine, job, task or file
    ├── Forbidden          a job file outside the job's run dir
    ├── Conflict           duplicate name, busy machines, not enough machines, ...
    ├── Invalid            a body that parses but cannot be done
    ├── TooMany            over a cap (a user's queued jobs): 429
    └── ServerFailed       any other error answer of corral serve (as its client sees it)
```

corral.client raises the server's own classes for its error answers (a
:class:`Conflict` on both sides): ``corral.api.errors`` and ``corral.client.http``
map the classes to the wire and back; nothing here knows the protocol.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any


class CorralError(Exception):
    """Base class of every error corral raises on purpose."""

    def details(self) -> list[str]:
        """Extra lines shown under the one-line message with ``-v``."""
        return []


class ConfigError(CorralError):
    """Bad hostfile, cluster file or option. Names ``file:line`` or the option."""

    def __init__(
        self,
        message: str,
        *,
        source: str | None = None,
        line: int | None = None,
        option: str | None = None,
    ) -> None:
        self.message = message
        self.source = source
        self.line = line
        self.option = option
        where = ""
        if source is not None:
            where = f"{source}:{line}: " if line is not None else f"{source}: "
        elif option is not None:
            where = f"{option}: "
        super().__init__(f"{where}{message}")


class TransportError(CorralError):
    """A command could not be run or supervised on a host."""

    def __init__(
        self,
        message: str,
        *,
        host: str,
        command: str | None = None,
        cause: str | None = None,
    ) -> None:
        self.message = message
        self.host = host
        self.command = command
        self.cause = cause
        text = f"{host}: {message}"
        if cause:
            text += f" ({cause})"
        super().__init__(text)

    def details(self) -> list[str]:
        return [f"command: {self.command}"] if self.command else []


class ConnectError(TransportError):
    """The host is unreachable, refused the connection or rejected our credentials."""


class CommandTimeout(TransportError):
    """A command did not finish within its deadline."""


class ConnectionLost(TransportError):
    """An established connection to the host broke (host down, link cut)."""


class CheckFailed(CorralError):
    """One or more pre-flight checks failed; each result carries a fix command."""

    def __init__(self, results: Sequence[Any]) -> None:
        self.results = list(results)
        names = ", ".join(str(getattr(r, "name", r)) for r in self.results)
        super().__init__(f"pre-flight checks failed: {names}")


class LaunchError(CorralError):
    """The job could not be started (master port taken, script missing, ...)."""

    def __init__(self, message: str, *, host: str | None = None) -> None:
        self.host = host
        super().__init__(f"{host}: {message}" if host else message)


class JobFailed(CorralError):
    """The job ran and failed; carries the root cause (earliest failure)."""

    def __init__(
        self,
        message: str,
        *,
        host: str | None = None,
        rank: int | None = None,
        exit_code: int | None = None,
        signal_name: str | None = None,
        stderr_tail: Sequence[str] = (),
    ) -> None:
        self.host = host
        self.rank = rank
        self.exit_code = exit_code
        self.signal_name = signal_name
        self.stderr_tail = list(stderr_tail)
        super().__init__(message)

    def details(self) -> list[str]:
        return list(self.stderr_tail)


class ClientError(CorralError):
    """A request of corral's client (:mod:`corral.client`) to ``corral serve`` failed."""

    def __init__(self, message: str, *, server: str) -> None:
        self.server = server
        super().__init__(message)


class ServerUnreachable(ClientError):
    """``corral serve`` does not answer at the URL (refused, timed out, connection cut)."""


class TokenRefused(ClientError):
    """The server refused the token: it is missing or wrong."""

    def __init__(self, *, server: str) -> None:
        super().__init__(
            "the server refused the token (set CORRAL_TOKEN or --token-file)", server=server
        )


class ServiceError(CorralError):
    """A request the server refuses; ``type`` names the kind of refusal, ``details``
    a JSON-able dict (what is available, suggestions, the field at fault)."""

    type = "bad_request"

    def __init__(self, message: str, *, details: dict[str, Any] | None = None) -> None:
        self.message = message
        self.info: dict[str, Any] = dict(details or {})
        super().__init__(message)

    def details(self) -> list[str]:
        return [f"{key}: {json.dumps(value, default=str)}" for key, value in self.info.items()]


class NotFound(ServiceError):
    """An unknown machine, job, task or job file."""

    type = "not_found"


class Forbidden(ServiceError):
    """A request for something the server never hands out: a path outside a job's
    run dir."""

    type = "forbidden"


class Conflict(ServiceError):
    """The request clashes with the current state: a duplicate name, busy or too
    few machines, a job dispatched twice."""

    type = "conflict"


class Invalid(ServiceError):
    """A well-formed request that cannot be done as asked."""

    type = "invalid"


class TooMany(ServiceError):
    """Over a cap on how many of something one user may have (queued jobs)."""

    type = "too_many"


class ServerFailed(ServiceError):
    """Any other error answer of ``corral serve``, as its client sees it: ``kind`` is
    the answer's error type (``internal``, ``unreachable``, ...)."""

    type = "server_failed"

    def __init__(
        self, message: str, *, kind: str = "server_failed", details: dict[str, Any] | None = None
    ) -> None:
        self.kind = kind
        super().__init__(message, details=details)
