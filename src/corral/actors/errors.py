"""The errors of :mod:`corral.actors`, in corral's one exception tree.

```
CorralError
├── LaunchError
│   └── ActorStartError    start(): the workers that never became ready, each with its cause
└── ActorError             host, rank
    ├── WorkerDied         exit code or signal, last stderr lines (a lost host too)
    │   └── WorkerRestarted  ... and was started again (max_restarts); the handle lives on
    ├── RemoteError        work_fn raised: the remote type, message and traceback text
    ├── ActorTimeout       recv(timeout=) ran out
    └── ActorGroupError    a group operation: one error per worker that failed
```
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

from corral.errors import CorralError, LaunchError


def _where(host: str, rank: int) -> str:
    return f"[{host}:{rank}]"


class ActorError(CorralError):
    """Something went wrong with one worker (``host``, global ``rank``)."""

    def __init__(self, message: str, *, host: str, rank: int) -> None:
        self.host = host
        self.rank = rank
        self.message = message
        super().__init__(f"{_where(host, rank)} {message}")


class WorkerDied(ActorError):
    """The worker process is gone: it exited, was killed, or its host was lost.

    ``exit_code`` is the exit status (None when killed or lost), ``signal_name``
    the signal that killed it (``"SIGKILL"``), ``lost`` the cause when the
    connection to the host broke, ``stderr_tail`` its last lines of stderr.
    """

    def __init__(
        self,
        message: str,
        *,
        host: str,
        rank: int,
        exit_code: int | None = None,
        signal_name: str | None = None,
        lost: str | None = None,
        stderr_tail: Sequence[str] = (),
    ) -> None:
        self.exit_code = exit_code
        self.signal_name = signal_name
        self.lost = lost
        self.stderr_tail = list(stderr_tail)
        super().__init__(message, host=host, rank=rank)

    def details(self) -> list[str]:
        return list(self.stderr_tail)


class WorkerRestarted(WorkerDied):
    """The worker died and was started again (``restarts`` times so far): raised once
    by ``recv``, before anything the new process sends and after its hello (the
    handle's ``pid`` is then the new process's; None if it failed before saying it);
    messages sent before are lost, so set the new worker up again."""

    def __init__(self, died: WorkerDied, restarts: int) -> None:
        self.restarts = restarts
        super().__init__(
            f"{died.message}; restarted ({restarts} so far)",
            host=died.host,
            rank=died.rank,
            exit_code=died.exit_code,
            signal_name=died.signal_name,
            lost=died.lost,
            stderr_tail=died.stderr_tail,
        )


class RemoteError(ActorError):
    """``work_fn`` raised on the worker (``phase`` "run"), or could not be loaded there
    (``phase`` "start"): ``type_name``, ``remote_message`` and the remote
    ``traceback`` text (also in :meth:`details` and ``str()``)."""

    def __init__(
        self,
        *,
        host: str,
        rank: int,
        type_name: str,
        remote_message: str,
        traceback: str,
        phase: str = "run",
    ) -> None:
        self.type_name = type_name
        self.remote_message = remote_message
        self.traceback = traceback
        self.phase = phase
        what = "could not load work_fn" if phase == "start" else "work_fn raised"
        super().__init__(f"{what}: {type_name}: {remote_message}", host=host, rank=rank)

    def __str__(self) -> str:
        return f"{super().__str__()}\n\nRemote traceback:\n{self.traceback.rstrip()}"

    def details(self) -> list[str]:
        return self.traceback.rstrip().splitlines()


class ActorTimeout(ActorError):
    """``recv(timeout=)`` (or a group operation's timeout) ran out with nothing received:
    ``timeout`` is the one asked for, ``waited`` the seconds actually waited (less
    in a group operation that gave up early because another worker failed;
    ``note`` says why)."""

    def __init__(
        self, *, host: str, rank: int, timeout: float, waited: float | None = None, note: str = ""
    ) -> None:
        self.timeout = timeout
        self.waited = timeout if waited is None else waited
        self.note = note
        message = f"no message within {self.waited:.1f} s"
        super().__init__(f"{message} ({note})" if note else message, host=host, rank=rank)


class ActorGroupError(ActorError):
    """A group operation failed on some workers: ``errors`` maps each failing rank to
    its error (rank order); ``results`` holds what the others answered (rank ->
    value). ``order`` lists the failing ranks root cause first: the workers that
    failed, in the order they did (``failed_first``, else by rank), then the ones
    that only timed out. ``host``/``rank`` and the first line name the root cause."""

    def __init__(
        self,
        operation: str,
        errors: Mapping[int, ActorError],
        results: Mapping[int, object],
        failed_first: Iterable[int] = (),
    ) -> None:
        self.operation = operation
        self.errors = dict(sorted(errors.items()))
        self.results = dict(results)
        self.order = list(dict.fromkeys(r for r in failed_first if r in self.errors))
        self.order += sorted(
            (r for r in self.errors if r not in self.order),
            key=lambda r: (isinstance(self.errors[r], ActorTimeout), r),
        )
        first = self.errors[self.order[0]]
        names = ", ".join(_where(e.host, e.rank) for e in self._ordered())
        super().__init__(
            f"{operation} failed on {len(self.errors)} worker(s): {names}",
            host=first.host,
            rank=first.rank,
        )

    def _ordered(self) -> list[ActorError]:
        return [self.errors[r] for r in self.order]

    def __str__(self) -> str:
        lines = [super().__str__()]
        lines.extend(f"  {_where(e.host, e.rank)} {e.message}" for e in self._ordered())
        return "\n".join(lines)

    def details(self) -> list[str]:
        return [str(e) for e in self._ordered()]


class ActorStartError(LaunchError):
    """``Cluster.start`` failed: ``errors`` maps each worker (rank) that did not
    become ready within ``wait_time`` to its cause; every worker was stopped."""

    def __init__(self, errors: Mapping[int, ActorError]) -> None:
        self.errors = dict(sorted(errors.items()))
        lines = [f"{_where(e.host, e.rank)} {e.message}" for e in self.errors.values()]
        super().__init__(f"{len(self.errors)} worker(s) did not start: " + "; ".join(lines))

    def details(self) -> list[str]:
        out: list[str] = []
        for error in self.errors.values():
            out.extend(error.details())
        return out


__all__ = [
    "ActorError",
    "ActorGroupError",
    "ActorStartError",
    "ActorTimeout",
    "RemoteError",
    "WorkerDied",
    "WorkerRestarted",
]
