"""Making the newest complete checkpoint available to every host of the next attempt.

Which host becomes global rank 0 is not something corral can promise (torchrun's
c10d rendezvous does not order the nodes), so placement never predicts it: the
newest complete ``ckpt-N.pt`` found on any host or in the coordinator's replica
is put on **every** host of the next attempt's world that lacks it. Hosts that
already hold it (their own save, or a filesystem shared with a host that wrote
it) are left alone; the others receive one concurrent copy, read once from one
source and streamed to all of them (see :mod:`.transfer`). When a source breaks
off, the hosts still lacking the file are served by the next source that holds
it, the replica last. A host that cannot be listed or written is an error that
names it: restarting it from step 0 would silently lose every step.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from corral.cluster.model import Host
from corral.recovery.checkpoints.common import (
    REPLICA_SOURCE,
    STALL_TIMEOUT,
    SURVEY_TIMEOUT,
    CheckpointTransferError,
)
from corral.recovery.checkpoints.replica import Replica
from corral.recovery.checkpoints.survey import Candidate, HostCheckpoints, newest, survey
from corral.recovery.checkpoints.transfer import CopyResult, copy_to_many
from corral.transport.base import Transport

__all__ = ["CheckpointPlacement", "WorldPlacement", "ensure_latest_on", "place_latest"]

_SPACE = ("ENOSPC", "EDQUOT")


@dataclass(frozen=True)
class CheckpointPlacement:
    """What placement did for one host.

    ``action``: ``"none"`` (no complete checkpoint anywhere: the job starts from
    scratch), ``"present"`` (the host already had the newest one) or ``"copied"``.
    """

    action: Literal["none", "present", "copied"]
    target: str
    step: int | None = None
    name: str | None = None
    source: str | None = None
    """Host it came from, :data:`REPLICA_SOURCE`, or the target itself when present."""
    path: str | None = None
    """Absolute path on the target."""
    bytes: int = 0
    seconds: float = 0.0
    unreachable: tuple[str, ...] = ()
    """Hosts whose checkpoints could not be listed (``name: why``)."""
    failed: tuple[str, ...] = ()
    """Copies to this host that were tried first and failed (``source: why``)."""

    def describe(self) -> str:
        """One line for the run summary."""
        if self.action == "none":
            return "no complete checkpoint on any host or in the replica: starting from scratch"
        if self.action == "present":
            return f"checkpoint {self.name} (step {self.step}) already on {self.target}"
        mb = self.bytes / 1e6
        return (
            f"copied checkpoint {self.name} (step {self.step}, {mb:.1f} MB) from {self.source} "
            f"to {self.target}:{self.path} in {self.seconds:.1f} s"
        )

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form."""
        return {
            "action": self.action,
            "target": self.target,
            "step": self.step,
            "name": self.name,
            "source": self.source,
            "path": self.path,
            "bytes": self.bytes,
            "seconds": round(self.seconds, 3),
            "unreachable": list(self.unreachable),
            "failed": list(self.failed),
        }


@dataclass(frozen=True)
class WorldPlacement:
    """What :func:`place_latest` did for every host of the next attempt."""

    hosts: tuple[CheckpointPlacement, ...]
    """One per target, in the targets' order."""
    step: int | None = None
    name: str | None = None
    unreachable: tuple[str, ...] = ()
    """Other hosts whose checkpoints could not be listed (``name: why``)."""

    @property
    def action(self) -> Literal["none", "present", "copied"]:
        """``"none"`` (nothing anywhere), ``"copied"`` (to one host or more), else
        ``"present"``."""
        if self.step is None:
            return "none"
        return "copied" if any(h.action == "copied" for h in self.hosts) else "present"

    def on(self, host: str) -> CheckpointPlacement:
        """The placement for ``host`` (KeyError when it was no target)."""
        for placed in self.hosts:
            if placed.target == host:
                return placed
        raise KeyError(host)

    def describe(self) -> str:
        """A short line for the attempts table, e.g. ``ckpt-00000040.pt (step 40): on tb1;
        copied from tb1 to tb2, tb3 (12.0 MB, 1.3 s)``."""
        if self.step is None:
            return "no complete checkpoint on any host or in the replica: starting from scratch"
        present = [h.target for h in self.hosts if h.action == "present"]
        parts = [f"already on {', '.join(present)}"] if present else []
        sources: dict[str, list[CheckpointPlacement]] = {}
        for placed in self.hosts:
            if placed.action == "copied" and placed.source is not None:
                sources.setdefault(placed.source, []).append(placed)
        for source, copies in sources.items():
            mb = copies[0].bytes / 1e6
            seconds = max(c.seconds for c in copies)
            targets = ", ".join(c.target for c in copies)
            parts.append(f"copied from {source} to {targets} ({mb:.1f} MB, {seconds:.1f} s)")
        return f"checkpoint {self.name} (step {self.step}): " + "; ".join(parts)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form."""
        return {
            "action": self.action,
            "step": self.step,
            "name": self.name,
            "hosts": [h.to_dict() for h in self.hosts],
            "unreachable": list(self.unreachable),
        }


def _unique(hosts: Sequence[Host]) -> list[Host]:
    seen: dict[str, Host] = {}
    for host in hosts:
        seen.setdefault(host.name, host)
    return list(seen.values())


def _holds(listing: HostCheckpoints, chosen: Sequence[Candidate]) -> bool:
    """Whether ``listing``'s host holds the chosen checkpoint, whole (same size as
    another holder's copy, when there is one)."""
    have = listing.find(chosen[0].name)
    if have is None or not have.complete:
        return False
    others = [c for c in chosen if c.host is None or c.host.host.name != listing.host.name]
    return not others or any(have.size == c.size for c in others)


def _unlisted(targets: Sequence[Host], listed: dict[str, HostCheckpoints], directory: str) -> None:
    bad = [listed[h.name] for h in targets if not listed[h.name].ok]
    if not bad:
        return
    if len(bad) == 1:
        raise CheckpointTransferError(
            f"cannot list the checkpoints in {directory}: {bad[0].error}", host=bad[0].host.name
        )
    raise CheckpointTransferError(
        f"cannot list the checkpoints in {directory} on {len(bad)} hosts: "
        + "; ".join(f"{b.host.name}: {b.error}" for b in bad),
        host=bad[0].host.name,
    )


async def place_latest(
    transport: Transport,
    targets: Sequence[Host],
    directory: str,
    cwd_of: Callable[[Host], str | None],
    replica: Replica | None = None,
    *,
    sources: Sequence[Host] = (),
    python: str | None = None,
    survey_timeout: float = SURVEY_TIMEOUT,
    stall_timeout: float = STALL_TIMEOUT,
) -> WorldPlacement:
    """Make sure the newest complete checkpoint is in ``directory`` on every target.

    Looks at every target, every host in ``sources`` (those that cannot be asked are
    skipped and listed in the result) and the coordinator ``replica``; picks the
    highest step among *complete* rank-0 checkpoints (temp files and damaged files
    are never candidates). A target that holds that file (same name, complete, same
    size) is left alone; the others get one concurrent copy from a host that holds
    it, falling back to the next holder and then to the replica for the targets a
    failed copy left without it. A copy is teed into ``replica`` when that lacks it.

    Raises :class:`CheckpointTransferError` naming the host when a target cannot be
    listed, lacks the space (naming the path) or could not be given the file.
    """
    targets = _unique(targets)
    hosts = _unique([*targets, *sources])
    listed = await survey(
        transport, hosts, directory, cwd_of, python=python, timeout=survey_timeout
    )
    _unlisted(targets, listed, directory)
    unreachable = tuple(f"{n}: {r.error}" for n, r in listed.items() if not r.ok)
    chosen = newest(listed, replica.latest() if replica is not None else None)
    if not chosen:
        none = tuple(CheckpointPlacement("none", t.name, unreachable=unreachable) for t in targets)
        return WorldPlacement(none, unreachable=unreachable)
    name, step, size = chosen[0].name, chosen[0].step, chosen[0].size
    done: dict[str, CheckpointPlacement] = {}
    for target in targets:
        mine = listed[target.name]
        if _holds(mine, chosen):
            done[target.name] = CheckpointPlacement(
                "present",
                target.name,
                step=step,
                name=name,
                source=target.name,
                path=mine.path_of(name),
                bytes=size,
                unreachable=unreachable,
            )
    errors: dict[str, CheckpointTransferError] = {}
    for target in targets:
        mine = listed[target.name]
        if target.name not in done and mine.free is not None and mine.free < size:
            errors[target.name] = CheckpointTransferError(
                f"cannot write {mine.path_of(name)}: no space left on device "
                f"({size} bytes needed, {mine.free} bytes free)",
                host=target.name,
                errno_name="ENOSPC",
            )
    lacking = [t for t in targets if t.name not in done and t.name not in errors]
    failed: dict[str, list[str]] = {t.name: [] for t in lacking}
    holders = [c for c in chosen if c.host is not None and c.host.host.name not in failed]
    ordered = holders + [c for c in chosen if c.host is None]  # the replica last
    for candidate in ordered:
        if not lacking:
            break
        label = candidate.host.host.name if candidate.host is not None else REPLICA_SOURCE
        try:
            copied = await _copy(
                transport, candidate, lacking, directory, cwd_of, replica, python, stall_timeout
            )
        except CheckpointTransferError as exc:  # the source broke off: nobody got it
            for target in lacking:
                failed[target.name].append(f"{label}: {exc}")
                errors[target.name] = exc
            continue
        still: list[Host] = []
        for target in lacking:
            outcome = copied[target.name]
            if isinstance(outcome, CopyResult):
                errors.pop(target.name, None)
                done[target.name] = _copied(outcome, unreachable, failed[target.name])
                continue
            failed[target.name].append(f"{label}: {outcome}")
            errors[target.name] = outcome
            if outcome.errno_name not in _SPACE:  # another source will not make room
                still.append(target)
        lacking = still
    if errors:
        raise _failure(name, step, targets, errors, failed)
    return WorldPlacement(
        tuple(done[t.name] for t in targets), step=step, name=name, unreachable=unreachable
    )


async def _copy(
    transport: Transport,
    candidate: Candidate,
    targets: Sequence[Host],
    directory: str,
    cwd_of: Callable[[Host], str | None],
    replica: Replica | None,
    python: str | None,
    stall_timeout: float,
) -> dict[str, CopyResult | CheckpointTransferError]:
    pairs = [(t, cwd_of(t)) for t in targets]
    if candidate.host is not None:
        return await copy_to_many(
            transport,
            candidate.host.host,
            pairs,
            directory=directory,
            source_path=candidate.host.path_of(candidate.name),
            replica=replica,
            python=python,
            stall_timeout=stall_timeout,
        )
    assert candidate.replica_file is not None
    return await copy_to_many(
        transport,
        candidate.replica_file,
        pairs,
        directory=directory,
        python=python,
        stall_timeout=stall_timeout,
    )


def _copied(
    copy: CopyResult, unreachable: tuple[str, ...], failed: Sequence[str]
) -> CheckpointPlacement:
    return CheckpointPlacement(
        "copied",
        copy.target,
        step=copy.step,
        name=copy.name,
        source=copy.source,
        path=copy.target_path,
        bytes=copy.size,
        seconds=copy.seconds,
        unreachable=unreachable,
        failed=tuple(failed),
    )


def _failure(
    name: str,
    step: int,
    targets: Sequence[Host],
    errors: dict[str, CheckpointTransferError],
    failed: dict[str, list[str]],
) -> CheckpointTransferError:
    order = [t.name for t in targets if t.name in errors]
    first = errors[order[0]]
    if len(order) == 1 and first.errno_name in _SPACE:
        return first  # the host's own words: path, bytes needed and free
    if len(order) == 1:
        host = order[0]
        why = "; ".join(failed.get(host) or [str(first)])
        return CheckpointTransferError(
            f"could not copy checkpoint {name} (step {step}) to {host}: {why}",
            host=host,
            errno_name=first.errno_name,
        )
    each = "; ".join(f"{h}: " + " / ".join(failed.get(h) or [str(errors[h])]) for h in order)
    return CheckpointTransferError(
        f"could not place checkpoint {name} (step {step}) on {', '.join(order)}: {each}",
        host=order[0],
        errno_name=first.errno_name,
    )


async def ensure_latest_on(
    transport: Transport,
    target: Host,
    survivors: Sequence[Host],
    directory: str,
    cwd_of: Callable[[Host], str | None],
    replica: Replica | None = None,
    *,
    python: str | None = None,
    survey_timeout: float = SURVEY_TIMEOUT,
    stall_timeout: float = STALL_TIMEOUT,
) -> CheckpointPlacement:
    """:func:`place_latest` for one ``target``, with ``survivors`` as further sources."""
    placed = await place_latest(
        transport,
        [target],
        directory,
        cwd_of,
        replica,
        sources=survivors,
        python=python,
        survey_timeout=survey_timeout,
        stall_timeout=stall_timeout,
    )
    return placed.hosts[0]
