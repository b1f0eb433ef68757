"""Checkpoints without a shared filesystem, during a job and between its attempts.

With ``--checkpoint-dir`` on SSH hosts the directory may be host-local: rank 0
writes ``ckpt-N.pt`` on its own disk. Before a restart the keeper makes sure
the newest *complete* checkpoint is on the host that becomes rank 0 (copied from
a surviving host, else from the coordinator's replica); with
``--replicate-checkpoints`` it pulls every announced checkpoint into
``runs/<job>/checkpoints/`` while the job runs. The ranks then run with
``CORRAL_CHECKPOINT_REPLICA=wait``: rank 0's ``save_checkpoint`` sends its
announcement with ``"ack": true`` and returns only when the keeper answers
(``{"type": "replicated", "name", "ok", "error"}``, through the node agent's
``reply`` op) that the replica holds it, so losing rank 0's host loses no more
than the steps since the last save. The copy goes through a sender kept running
on the writing host (started when each attempt starts), so a save waits for the
bytes only, not for a new SSH session. See :mod:`corral.recovery.checkpoints`.
"""

from __future__ import annotations

import asyncio
import contextlib
import posixpath
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from rich.console import Console

from corral.agent.protocol import encode_op
from corral.cluster.model import Host
from corral.errors import CorralError
from corral.job.output import say
from corral.plan.render import node_cwd
from corral.recovery.checkpoints import Replica, ensure_latest_on
from corral.transport.base import Transport

if TYPE_CHECKING:
    from corral.job.engine import LaunchOptions, Prepared
    from corral.job.supervisor import NodeRun


def rank0_host(prepared: Prepared) -> Host:
    """The host that will run global rank 0 in ``prepared``'s attempt.

    The python launcher puts rank 0 on node 0. torchrun's c10d rendezvous ranks
    the nodes by their sorted ``--local-addr`` (corral passes each host's address).
    """
    commands = prepared.commands
    if prepared.spec.launcher == "torchrun":
        return min(commands, key=lambda c: c.host.address).host
    return commands[0].host


@dataclass
class CheckpointKeeper:
    """Replicates announced checkpoints and places the latest one before a restart."""

    transport: Transport
    console: Console
    directory: str | None = None
    python: str | None = None
    replica: Replica | None = None
    _pulls: set[asyncio.Task[Any]] = field(default_factory=set)
    _waiting: int = 0  # ranks whose save waits for a copy now

    @classmethod
    def create(
        cls, prepared: Prepared, opts: LaunchOptions, transport: Transport, console: Console
    ) -> CheckpointKeeper:
        """A keeper for the job: inactive for ``local:N`` (one filesystem) or without
        ``--checkpoint-dir``."""
        if not opts.checkpoint_dir or opts.cluster.is_local:
            return cls(transport, console)
        replica = None
        if opts.replicate_checkpoints:
            replica = Replica.for_job(
                prepared.spec.run_dir, prepared.spec.job_id, python=opts.python
            )
        return cls(transport, console, opts.checkpoint_dir, opts.python, replica)

    def warm(self, prepared: Prepared) -> None:
        """An attempt starts: start the sender on the host expected to write rank 0's
        checkpoints, so the first copy does not wait for a new session."""
        if self.replica is not None:
            self.replica.warm(self.transport, rank0_host(prepared))

    def on_report(self, node: NodeRun, event: dict[str, Any]) -> None:
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

    async def _pull(self, node: NodeRun, event: dict[str, Any], path: str) -> None:
        ack = bool(event.get("ack"))
        self._waiting += ack
        try:
            await self._copy_and_answer(node, event, path, ack)
        finally:
            self._waiting -= ack

    async def _copy_and_answer(
        self, node: NodeRun, event: dict[str, Any], path: str, ack: bool
    ) -> None:
        name = posixpath.basename(path)
        ok: bool = False
        error: str | None = "corral keeps no replica of this job's checkpoints"
        if self.replica is not None:
            try:
                result = await self.replica.pull(self.transport, node.host, path)
                if result.status == "failed":
                    say(self.console, f"checkpoint replica: {result.error}", style="yellow")
                ok, error = await self.replica.confirm(name)
            except (CorralError, ValueError) as exc:
                say(self.console, f"checkpoint replica: {exc}", style="yellow")
                ok, error = False, str(exc)
        if ack and node.proc is not None:
            message = {"type": "replicated", "name": name, "ok": ok, "error": error}
            rank = event.get("rank", 0)
            node.proc.write(encode_op({"op": "reply", "rank": rank, "message": message}))

    async def place(self, prepared: Prepared) -> str | None:
        """Make the latest complete checkpoint available to the next attempt's rank 0;
        returns what was done (for the attempts table), None when nothing applies.
        Raises a CorralError naming the host when it cannot be done (a restart from
        scratch would silently lose every step)."""
        if self.directory is None:
            return None
        target = rank0_host(prepared)
        hosts = [c.host for c in prepared.commands]
        placement = await ensure_latest_on(
            self.transport,
            target,
            hosts,
            self.directory,
            lambda h: node_cwd(prepared.spec, h),
            self.replica,
            python=self.python,
        )
        text = placement.describe()
        say(self.console, f"{text}", style="bold")
        return text if placement.action != "none" else None

    async def close(self) -> None:
        """Stop pulls still running (they leave no partial file) and the senders."""
        for task in list(self._pulls):
            task.cancel()
        with contextlib.suppress(BaseException):
            await asyncio.gather(*self._pulls, return_exceptions=True)
        if self.replica is not None:
            await self.replica.close()
