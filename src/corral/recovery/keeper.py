"""Checkpoints without a shared filesystem, during a job and between its attempts.

With ``--checkpoint-dir`` on SSH hosts the directory may be host-local: rank 0
writes ``ckpt-N.pt`` on its own disk. Before a restart the keeper makes sure
the newest *complete* checkpoint is on **every** host of the next attempt (copied
from a surviving host, else from the coordinator's replica), so whichever host
the rendezvous makes rank 0 resumes from it; nothing depends on predicting that
host. With ``--replicate-checkpoints`` it pulls every announced checkpoint into
``runs/<job>/checkpoints/`` while the job runs. The ranks then run with
``CORRAL_CHECKPOINT_REPLICA=wait``: rank 0's ``save_checkpoint`` sends its
announcement with ``"ack": true`` and returns only when the keeper answers
(``{"type": "replicated", "name", "ok", "error"}``, through the node agent's
``reply`` op) that the replica holds it, so losing rank 0's host loses no more
than the steps since the last save. The copy goes through a sender kept running
on each host (started when each attempt starts), so a save waits for the bytes
only, not for a new SSH session. See :mod:`corral.recovery.checkpoints`.
"""

from __future__ import annotations

import asyncio
import contextlib
import posixpath
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from corral.agent.protocol import encode_op
from corral.cluster.model import Host
from corral.errors import CorralError
from corral.outcomes import Level
from corral.plan.render import node_cwd
from corral.plan.spec import JobSpec, NodeCommand
from corral.transport.base import NodeProcess, Transport

if TYPE_CHECKING:  # imported where used: most jobs keep no checkpoints here
    from corral.recovery.checkpoints import Replica

__all__ = ["CheckpointKeeper", "ReportingNode", "Say"]

#: How the keeper tells the user something: ``say(text, level)`` (an event level).
Say = Callable[[str, Level], None]


class ReportingNode(Protocol):
    """The node a report came from (the supervisor's ``NodeRun``)."""

    @property
    def host(self) -> Host:
        """The node's host."""
        ...

    @property
    def proc(self) -> NodeProcess | None:
        """The node agent's process (answers go to its stdin), None once gone."""
        ...


def _world(commands: Sequence[NodeCommand]) -> list[Host]:
    hosts: dict[str, Host] = {}
    for command in commands:
        hosts.setdefault(command.host.name, command.host)
    return list(hosts.values())


@dataclass
class CheckpointKeeper:
    """Replicates announced checkpoints and places the latest one on every host
    before a restart."""

    transport: Transport
    say: Say
    directory: str | None = None
    python: str | None = None
    replica: Replica | None = None
    _pulls: set[asyncio.Task[Any]] = field(default_factory=set)
    _waiting: int = 0  # ranks whose save waits for a copy now

    @classmethod
    def create(
        cls,
        transport: Transport,
        *,
        directory: str | None,
        replicate: bool,
        is_local: bool,
        python: str | None,
        run_dir: str,
        job_id: str,
        say: Say,
    ) -> CheckpointKeeper:
        """A keeper for job ``job_id``: inactive for ``local:N`` (``is_local``: one
        filesystem) or without a checkpoint ``directory``; with ``replicate`` it keeps
        the replica in ``run_dir/job_id/checkpoints``."""
        if not directory or is_local:
            return cls(transport, say)
        from corral.recovery.checkpoints import Replica

        replica = Replica.for_job(run_dir, job_id, python=python) if replicate else None
        return cls(transport, say, directory, python, replica)

    def warm(self, spec: JobSpec, commands: Sequence[NodeCommand]) -> None:
        """An attempt starts: start the sender on every host of it (any may run rank
        0 and write the checkpoints), so the first copy does not wait for a session."""
        if self.replica is not None:
            for host in _world(commands):
                self.replica.warm(self.transport, host)

    def on_report(self, node: ReportingNode, event: dict[str, Any]) -> None:
        """A rank announced a saved checkpoint: pull it into the replica (newest wins),
        then answer the rank when it waits for that (``"ack": true``)."""
        if event.get("type") != "checkpoint" or (self.replica is None and not event.get("ack")):
            return
        path = event.get("path")
        if not isinstance(path, str):
            return
        task = asyncio.ensure_future(self._pull(node, event, path))
        self._pulls.add(task)
        task.add_done_callback(self._pulls.discard)

    def holding(self) -> bool:
        """Whether a rank's save is waiting for its copy (the job is held up by corral,
        which the hang detector must not take for a hang)."""
        return self._waiting > 0

    async def _pull(self, node: ReportingNode, event: dict[str, Any], path: str) -> None:
        ack = bool(event.get("ack"))
        self._waiting += ack
        try:
            await self._copy_and_answer(node, event, path, ack)
        finally:
            self._waiting -= ack

    async def _copy_and_answer(
        self, node: ReportingNode, event: dict[str, Any], path: str, ack: bool
    ) -> None:
        name = posixpath.basename(path)
        ok: bool = False
        error: str | None = "corral keeps no replica of this job's checkpoints"
        if self.replica is not None:
            try:
                result = await self.replica.pull(self.transport, node.host, path)
                if result.status == "failed":
                    self.say(f"checkpoint replica: {result.error}", "warning")
                ok, error = await self.replica.confirm(name)
            except (CorralError, ValueError) as exc:
                self.say(f"checkpoint replica: {exc}", "warning")
                ok, error = False, str(exc)
        proc = node.proc
        if ack and proc is not None:
            message = {"type": "replicated", "name": name, "ok": ok, "error": error}
            rank = event.get("rank", 0)
            proc.write(encode_op({"op": "reply", "rank": rank, "message": message}))

    async def place(self, spec: JobSpec, commands: Sequence[NodeCommand]) -> str | None:
        """Make the latest complete checkpoint available on every host of the next
        attempt (``commands``: its plan); returns what was done, one short line for
        the attempts table, or None when there is nothing to place. Raises a
        CorralError naming the host when that cannot be done (a restart from scratch
        would silently lose every step)."""
        if self.directory is None:
            return None
        from corral.recovery.checkpoints import place_latest

        placement = await place_latest(
            self.transport,
            _world(commands),
            self.directory,
            lambda h: node_cwd(spec, h),
            self.replica,
            python=self.python,
        )
        text = placement.describe()
        self.say(text, "info")
        return text if placement.action != "none" else None

    async def close(self) -> None:
        """Stop pulls still running (they leave no partial file) and the senders."""
        for task in list(self._pulls):
            task.cancel()
        with contextlib.suppress(BaseException):
            await asyncio.gather(*self._pulls, return_exceptions=True)
        if self.replica is not None:
            await self.replica.close()
