"""The supervisor of an in-place attempt (``--recovery in-place``, torchft).

The same :class:`~corral.job.supervisor.AttemptSupervisor` (agents, heartbeats, hang
detection, ``[host:rank]`` output, teardown), with one difference: a failure of
a node (a rank died, its host was lost, it hung) tears down only that node's
replica group; the other groups go on with a smaller torchft quorum and the
lost group is started again (same host when it answers, else a spare host) to
rejoin by healing from a live peer. What follows a loss is decided by
:func:`corral.recovery.inplace.decide_group`: below ``--min-nodes`` live groups
the whole attempt is stopped as a failure and the engine's restart policy restarts
every node from the disk checkpoint. A Lighthouse child that exits is started
again at the same address, the groups reconnect to it; the attempt falls back only
when it cannot be (:func:`corral.recovery.inplace.lighthouse_fallback`), saying why.
Group changes go out as :class:`~corral.job.events.GroupChanged` events and end
up in the result (``JobResult.groups``) for the summary.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import time
from collections.abc import Callable, Sequence
from typing import Any

from corral.agent.protocol import encode_op
from corral.cluster.model import Host
from corral.contract import FT_QUORUM_RETRIES_ENV, NODE_DIR_ENV, STATE_MISMATCH
from corral.defaults import DEFAULT_FT_JOIN_TIMEOUT
from corral.errors import ConfigError, LaunchError
from corral.job.events import GroupChanged, Progress
from corral.job.result import EXIT_LAUNCH, EXIT_LOST, Failure, JobResult, NodeRun
from corral.job.states import NodeState
from corral.job.supervisor import AttemptSupervisor, kill_recorded_groups
from corral.plan.spec import NodeCommand
from corral.recovery.hangwatch import HangWatch
from corral.recovery.health import HostWatch
from corral.recovery.inplace import (
    HEALING_MARKER,
    MAX_LIGHTHOUSE_RESTARTS,
    GroupEpisode,
    GroupLog,
    JoinWatch,
    decide_group,
    healing_source,
    lighthouse_fallback,
    never_joined,
)
from corral.recovery.lighthouse import Lighthouse, reachable_address
from corral.transport.options import SshOptions

#: Plans replica group ``group`` on ``host`` (a fresh store port when needed).
Replan = Callable[[int, Host], NodeCommand]


class ReplicaGroupSupervisor(AttemptSupervisor):
    """Supervises an attempt whose nodes are torchft replica groups."""

    def __init__(
        self,
        commands: Sequence[NodeCommand],
        *args: Any,
        lighthouse: Lighthouse,
        replan: Replan,
        spares: Sequence[Host] = (),
        min_nodes: int | None = None,
        join_timeout: float | None = None,
        join_poll: float = 1.0,
        **kwargs: Any,
    ) -> None:
        super().__init__(commands, *args, **kwargs)
        # a group must join torchft's quorum this long after its start (default: the
        # rendezvous timeout, --rdzv-timeout)
        self.joins = JoinWatch(self.master_timeout if join_timeout is None else join_timeout)
        self._join_poll = join_poll
        self.lighthouse = lighthouse
        self.replan = replan
        self.spares = list(spares)
        self.min_nodes = min_nodes
        self.groups = GroupLog()
        self._group: dict[int, int] = {id(n): n.command.node_rank for n in self.nodes}
        self._retired: set[int] = set()
        self._losses: dict[int, Failure] = {}  # what took each torn-down group down
        self._restarts: dict[tuple[int, str], int] = {}
        self._current: NodeRun | None = None  # the node whose event is being handled
        self._last_step: dict[int, int] = {}  # group -> its latest committed step
        # group -> its restarted node, rejoined but not announced yet: its heal's log line
        # (which names the peer) and its first step come on different streams
        self._unannounced: dict[int, tuple[NodeRun, GroupEpisode]] = {}
        self._hang_timeout = kwargs.get("hang_timeout")
        self._hang_dir = kwargs.get("hang_dir")
        self._falling_back = False
        self._lighthouse_restarting = False  # a new Lighthouse is being started

    # -- which node a failure belongs to ---------------------------------------------

    def _group_of(self, node: NodeRun) -> int:
        return self._group[id(node)]

    def _live(self) -> list[NodeRun]:
        return [n for n in self.nodes if id(n) not in self._retired and not n.state.terminal]

    def _node_for(self, failure: Failure) -> NodeRun | None:
        if self._current is not None:
            return self._current
        for node in reversed(self.nodes):  # the newest node on that host
            if node.host.name == failure.host:
                return node
        return None

    def _on_event(self, node: NodeRun, event: dict[str, Any]) -> None:
        self._current = node
        try:
            super()._on_event(node, event)
        finally:
            self._current = None
        if event.get("event") == "report":
            self.joins.joined(id(node))  # its ranks run the script's training loop
            if event.get("type", "progress") == "progress":
                self._stepped(node, event.get("step"))

    def _node_gone(self, node: NodeRun, code: int) -> None:
        self._current = node
        try:
            super()._node_gone(node, code)
        finally:
            self._current = None

    def _declare_lost(self, node: NodeRun, detail: str) -> None:
        self._current = node
        try:
            super()._declare_lost(node, detail)
        finally:
            self._current = None

    # -- every group joins torchft's quorum, or the job says which never did --------

    async def _start_node(self, node: NodeRun) -> None:
        self.joins.started(id(node), self._group_of(node), node.host.name, time.monotonic())
        await super()._start_node(node)

    async def _watch_joins(self) -> None:
        """Fail the job, naming them, when started groups never join the quorum
        (their script never created a torchft Manager): never a silent hang."""
        while not self.machine.stopping:
            await asyncio.sleep(self._join_poll)
            for node in self.nodes:
                if node.state.terminal or id(node) in self._retired:
                    self.joins.joined(id(node))  # gone: nothing to wait for
            if not self.joins.pending:
                continue
            members = await self.lighthouse.members()
            if members is None or self.machine.stopping:
                continue  # the page could not be read: no verdict this round
            newest = {self._group_of(n): id(n) for n in self.nodes}
            self.joins.seen(members, newest)
            late = self.joins.overdue(time.monotonic())
            if late:
                message = never_joined(late, self.joins.timeout, "--rdzv-timeout")
                self._falling_back = True  # the whole job stops; a restart fails the same way
                self._fail(Failure.not_started(late[0][1], time.time(), message), EXIT_LAUNCH)
                return

    # -- a group fails -----------------------------------------------------------------

    def _fail(self, failure: Failure, exit_code: int) -> None:
        if self._falling_back or self.machine.stopping:
            super()._fail(failure, exit_code)
            return
        if f"{STATE_MISMATCH}:" in (failure.traceback or ""):
            # the groups' states differ after a heal: a restarted group would heal the
            # same way, so the attempt ends (a restart from disk starts every group alike)
            self._say(
                f"{failure.message}: the replica groups' states differ after a heal "
                f"({STATE_MISMATCH}); restarting a group would not help",
                "error",
            )
            self._falling_back = True
            super()._fail(failure, exit_code)
            return
        node = self._node_for(failure)
        if node is None or id(node) in self._retired:
            return  # a torn-down group's late news (its other ranks, its launcher)
        self._lose_group(node, failure)

    def _lose_group(self, node: NodeRun, failure: Failure) -> None:
        """Tear down ``node``'s group only and decide, once it is down, what follows."""
        self._retired.add(id(node))
        self._losses[id(node)] = failure
        if self.hang.detector is not None:  # its restart is judged on its own progress
            for record in node.ranks.values():
                self.hang.detector.forget(node.host.name, record.rank)
        group = self._group_of(node)
        live = self._live()
        before = {
            self._group_of(n): self._last_step[self._group_of(n)]
            for n in live
            if self._group_of(n) in self._last_step
        }
        episode = self.groups.lost(group, node.host.name, before, time.time(), failure.message)
        self._say(
            f"{failure.message}: in-place recovery tears down only group {group} "
            f"({node.host.name}); {len(live)} group(s) go on",
            "warning",
        )
        self._group_event(
            node.host.name, group, "lost", len(live), episode.lost_step, failure.message
        )
        if node.proc is not None and not node.state.terminal:
            node.set_state(NodeState.STOPPING)
            node.proc.write(encode_op({"op": "stop", "grace": self.grace}))
        self._tasks.append(asyncio.ensure_future(self._recover(node, group, episode)))

    async def _down(self, node: NodeRun) -> None:
        """Until ``node`` is terminal; SIGKILL after the grace period."""
        deadline = time.monotonic() + self.grace + 5.0
        while not node.state.terminal and time.monotonic() < deadline:
            await asyncio.sleep(0.1)
        if node.state.terminal or node.proc is None:
            return
        node.proc.write(encode_op({"op": "kill"}))
        node.proc.signal(signal.SIGKILL)
        if node.host.local:
            kill_recorded_groups(node.command.env.get(NODE_DIR_ENV, ""))
        deadline = time.monotonic() + 10.0
        while not node.state.terminal and time.monotonic() < deadline:
            await asyncio.sleep(0.1)

    async def _recover(self, node: NodeRun, group: int, episode: GroupEpisode) -> None:
        await self._down(node)
        if self.machine.stopping:
            return
        host = node.host
        answers = True
        if node.state == NodeState.LOST and not host.local:
            answers = await self._answers(host)
        if self.machine.stopping:
            return
        live = self._live()
        decision = decide_group(
            host=host.name,
            live=len(live),
            min_nodes=self.min_nodes,
            host_answers=answers,
            restarts_on_host=self._restarts.get((group, host.name), 0),
            spares=[h.name for h in self.spares],
            lighthouse_alive=self.lighthouse.alive or self._lighthouse_restarting,
            finished=any(n.state == NodeState.EXITED for n in self.nodes),
        )
        episode.action = decision.action
        if decision.action == "fallback":
            self._fallback(decision.reason, host.name, group, self._losses.get(id(node)))
            return
        if decision.action == "continue":
            self._say(f"group {group} ({host.name}): {decision.reason}", "warning")
            self._group_event(host.name, group, "continuing", len(live), None, decision.reason)
            return
        target = host
        if decision.host != host.name:
            target = next(h for h in self.spares if h.name == decision.host)
            self.spares.remove(target)
        key = (group, target.name)
        self._restarts[key] = self._restarts.get(key, 0) + 1
        episode.restarted_on = target.name
        fresh = NodeRun(
            command=self.replan(group, target),
            watch=HostWatch(target.name, time.monotonic()),
            listener=self._node_changed,
        )
        self._group[id(fresh)] = group
        self.nodes.append(fresh)
        self._say(f"group {group}: {decision.reason}; it rejoins by healing from a live peer")
        self._group_event(target.name, group, "restarting", len(live), None, decision.reason)
        await self._start_node(fresh)

    async def _answers(self, host: Host) -> bool:
        """The connectivity check of a lost host before its group is restarted there."""
        from corral.fleet.ping import failed_hosts, ping_hosts

        try:
            return not failed_hosts(await ping_hosts(self.transport, [host]))
        except Exception:
            return False

    def _fallback(self, why: str, host: str, group: int, loss: Failure | None = None) -> None:
        """Below ``--min-nodes`` or without a Lighthouse: end the attempt as a failure
        (the engine's restart policy restarts every node from the disk checkpoint);
        ``loss``: the group failure that left too few, whose words the cause keeps."""
        live = self._live()
        self._group_event(host, group, "fallback", len(live), None, why)
        message = f"{why}: falling back to a restart of every node from the disk checkpoint"
        tail: list[str] = []
        if loss is not None:
            message += f" (group {group} lost: {loss.message})"
            tail = list(loss.stderr_tail)
        self._falling_back = True
        cause = Failure(
            host, None, None, time.time(), message, tail, None if loss is None else loss.traceback
        )
        self._fail(cause, EXIT_LOST)

    async def _watch_lighthouse(self) -> None:
        """A Lighthouse that exits is started again at the same address (the groups
        reconnect: no restart from disk), unless :func:`lighthouse_fallback` says why
        not or it cannot start; then the attempt falls back, saying why."""
        while True:
            code = await self.lighthouse.wait()
            if self.machine.stopping:
                return
            retries = self.nodes[0].command.env.get(FT_QUORUM_RETRIES_ENV)
            why = lighthouse_fallback(code, self.lighthouse.restarts, retries)
            if why is None:
                self._lighthouse_restarting = True
                try:
                    await self.lighthouse.restart()
                except LaunchError as exc:
                    why = (
                        f"torchft's Lighthouse exited (code {code}) and could not be "
                        f"restarted: {exc}"
                    )
                finally:
                    self._lighthouse_restarting = False
            if self.machine.stopping:
                return
            if why is not None:
                self._fallback(why, self.nodes[0].host.name, -1)
                return
            self._say(
                f"torchft's Lighthouse exited (code {code}): corral restarted it at "
                f"{self.lighthouse.url} (restart {self.lighthouse.restarts} of "
                f"{MAX_LIGHTHOUSE_RESTARTS}); the groups reconnect to it, no restart from disk",
                "warning",
            )

    # -- a group comes back ------------------------------------------------------------

    def _stepped(self, node: NodeRun, step: Any) -> None:
        if id(node) in self._retired or isinstance(step, bool) or not isinstance(step, int):
            return
        group = self._group_of(node)
        now = time.time()
        self._last_step[group] = step
        self.groups.survivors_stepped(group, step, now)
        self._announce_when_known(group, step)  # back already, not said yet
        episode = self.groups.open_for(group)
        if episode is None or episode.restarted_on != node.host.name:
            return
        if episode.rejoined_step is None and node.started >= episode.lost_time:
            episode.rejoined_step, episode.rejoined_time = step, now
            self._unannounced[group] = (node, episode)
            self._announce_when_known(group, step)

    def _announce_when_known(self, group: int, step: int) -> None:
        """Say that ``group`` is back once the heal's source is known, or
        :data:`ANNOUNCE_WITHIN` steps after its first one without it."""
        pending = self._unannounced.get(group)
        if pending is None:
            return
        _, episode = pending
        back = episode.rejoined_step if episode.rejoined_step is not None else step
        if episode.healed_from or step >= back + ANNOUNCE_WITHIN:
            self._announce_rejoin(group)

    def _announce_rejoin(self, group: int) -> None:
        """Say that ``group`` is back (its rejoin step, the peer it healed from if known)."""
        pending = self._unannounced.pop(group, None)
        if pending is None:
            return
        node, episode = pending
        step, live = episode.rejoined_step, len(self._live())
        self._say(
            f"group {group} ({node.host.name}) rejoined at step {step}"
            + (f", healed from {episode.healed_from}" if episode.healed_from else "")
            + f"; {live} group(s) train",
            "success",
        )
        self._group_event(node.host.name, group, "rejoined", live, step, "", episode.healed_from)

    def _lines(self, host: str, rank: int, data: bytes) -> None:
        super()._lines(host, rank, data)
        if HEALING_MARKER not in data:
            return
        source = healing_source(data.decode("utf-8", "replace"))
        node = next((n for n in reversed(self.nodes) if n.host.name == host), None)
        if source is None or node is None:
            return
        pending = self._unannounced.get(self._group_of(node))
        episode = pending[1] if pending is not None else self.groups.open_for(self._group_of(node))
        if episode is None:
            return
        # torchft's source replica rank indexes the quorum's members by replica id: the
        # groups, in order, that trained when it healed (a peer that served the heal
        # may have finished since: it still counts)
        members = sorted(
            {
                self._group_of(n)
                for n in self.nodes
                if id(n) not in self._retired
                and (not n.state.terminal or n.state is NodeState.EXITED)
            }
        )
        if 0 <= source < len(members):
            peer = next(
                (n for n in reversed(self.nodes) if self._group_of(n) == members[source]), None
            )
            if peer is not None and peer is not node:
                episode.healed_from = peer.host.name
                group = self._group_of(node)
                pending = self._unannounced.get(group)
                if pending is not None and pending[0] is node:  # its first step came first
                    self._announce_rejoin(group)

    def _group_event(
        self,
        host: str,
        group: int,
        change: Any,
        participants: int,
        step: int | None,
        detail: str,
        healed_from: str | None = None,
    ) -> None:
        self.emit(
            GroupChanged(
                job_id=self.job_id,
                host=host,
                group=group,
                change=change,
                participants=participants,
                step=step,
                healed_from=healed_from,
                detail=detail,
            )
        )

    # -- hang detection goes on after a hung group was replaced ------------------------

    async def _watch_progress(self) -> None:
        while not self.machine.stopping:
            try:
                await super()._watch_progress()
            except Exception as exc:  # one hang's handling failed: keep watching
                self._say(f"hang detection: handling a hang failed ({exc!r})", "warning")
            live = {(n.host.name, r.rank) for n in self._live() for r in n.ranks.values()}
            self.hang = next_watch(self.hang, self._hang_timeout, self._hang_dir, live)

    # -- main ----------------------------------------------------------------------------

    async def run(self, *, handle_signals: bool = False) -> JobResult:
        """Run the attempt; the Lighthouse is watched throughout."""
        self._tasks.append(asyncio.ensure_future(self._watch_lighthouse()))
        self._tasks.append(asyncio.ensure_future(self._watch_joins()))
        result = await super().run(handle_signals=handle_signals)
        for group in list(self._unannounced):  # back, but not long enough to say so yet
            self._announce_rejoin(group)
        result.groups = self.groups.to_json()
        return result


#: Steps after a restarted group's first one within which its heal's log line (the
#: peer it healed from) is awaited before its return is announced without it.
ANNOUNCE_WITHIN = 3


def next_watch(
    old: HangWatch,
    timeout: float | None,
    directory: Any,
    live: set[tuple[str, int]] | None = None,
) -> HangWatch:
    """The hang watch after ``old`` fired (its blamed group is being replaced): the
    ranks its verdict saw carry over, as progressing now, but for the blamed ones and
    any not in ``live`` (the ranks of the groups that train on; None: the verdict's
    suspects are the ones left out). One that is stuck too (a second group hung
    meanwhile, or a suspect of the verdict whose group was not the one torn down)
    never reports again, and a fresh watch that had never seen it would never name it."""
    verdict = None if old.detector is None else old.detector.verdict
    watch = HangWatch(timeout, directory)
    if verdict is None:
        return watch
    for (host, rank), step in verdict.steps.items():
        key = (host, rank)
        kept = key not in verdict.suspects if live is None else key in live
        if step is not None and kept:
            watch.observe(host, rank, step)
    return watch


def progress_participants(event: Progress) -> int | None:
    """The live group count a progress report carries (``participants``), if any."""
    value = event.metrics.get("participants")
    return value if isinstance(value, int) and not isinstance(value, bool) else None


async def lighthouse_address(hosts: Sequence[Host], ssh: SshOptions | None) -> str:
    """The address the Lighthouse binds, where every host reaches the coordinator:
    127.0.0.1 when all nodes are local, else this machine's address on the route to
    the first remote host, as ssh reaches it (its HostName from the ssh config: an
    alias, such as a testbed's ``tb1``, need not resolve here). LaunchError when no
    route is found (the hosts could never join the quorum)."""
    remote = [h for h in hosts if not h.local]
    if not remote:
        return "127.0.0.1"
    host = remote[0]
    peer = host.address
    if ssh is not None:
        from corral.sync.sshargs import resolve_host

        with contextlib.suppress(ConfigError, OSError):
            peer = (await resolve_host(ssh, host)).hostname
    address = reachable_address(peer)
    if address is None:
        raise LaunchError(
            f"cannot start torchft's Lighthouse: no address of this machine routes to "
            f"{peer}; check the host's address in the hostfile or its HostName in the "
            "ssh config",
            host=host.name,
        )
    return address


async def setup(
    prepared: Any,
    spares: Sequence[Host],
    min_nodes: int | None,
    ssh: SshOptions | None = None,
    *,
    join_timeout: float = DEFAULT_FT_JOIN_TIMEOUT,
) -> tuple[Any, dict[str, Any]]:
    """Start the attempt's Lighthouse and plan every node as its own replica group:
    the re-planned ``prepared`` and the :class:`ReplicaGroupSupervisor`'s own arguments
    (``ssh``: how the hosts are reached, to find the address they reach us by;
    ``join_timeout``: the Lighthouse's, ``--ft-join-timeout``)."""
    import dataclasses
    import sys

    from corral.job.resolve import free_port
    from corral.plan.inplace import group_weights, plan_group
    from corral.recovery.inplace import RecoveryPolicy

    spec = prepared.spec
    hosts = [c.host for c in prepared.commands]
    address = await lighthouse_address(hosts, ssh)
    min_replicas = RecoveryPolicy.min_replicas(min_nodes)
    lighthouse = await Lighthouse.start(
        sys.executable, address, min_replicas, job_id=spec.job_id, join_timeout=join_timeout
    )
    groups = len(hosts)
    # calibration weights: one per group (the sum of its ranks'), re-split by the SDK
    # among the live groups
    weights = group_weights(spec.workload_weights, [c.nproc for c in prepared.commands])

    def replan(group: int, host: Host) -> NodeCommand:
        # local nodes share one machine: each group's store gets its own free port
        port = free_port() if host.local else spec.master_port
        return plan_group(
            spec,
            host,
            group,
            groups=groups,
            port=port,
            lighthouse=lighthouse.url,
            min_replicas=min_replicas,
            attempt=prepared.attempt,
            weights=weights,
        )

    commands = [replan(i, h) for i, h in enumerate(hosts)]
    extra = {
        "lighthouse": lighthouse,
        "replan": replan,
        "spares": list(spares),
        "min_nodes": min_nodes,
    }
    return dataclasses.replace(prepared, commands=commands), extra
