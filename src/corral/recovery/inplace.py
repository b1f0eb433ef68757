"""In-place recovery (``--recovery in-place``, torchft): the policy and its decisions (pure).

Every node is one torchft replica group: its local ranks form the group, the
groups are data-parallel replicas of each other and agree on each step through
torchft's Lighthouse, which corral runs on the coordinator
(:mod:`corral.recovery.lighthouse`). When a group fails (a rank dies, its host is
lost, it hangs) only that group is torn down: the others go on at their next step
with a smaller quorum, and corral restarts the lost group, on the same host when
it answers, else on a spare host (``--spares N``: the last N hosts of the cluster,
held in reserve); it rejoins by healing from a live peer (torchft's checkpoint
transport), not from disk. A Lighthouse that dies is started again at the same
address (the groups' torchft Managers reconnect: :func:`lighthouse_fallback` says
when they cannot). Below ``--min-nodes`` live groups, or when the Lighthouse cannot
be brought back, the attempt ends and the restart policy
(:mod:`corral.recovery.restart`) takes over: every node restarts from the disk
checkpoint, as with ``--recovery restart``. Spare hosts pass the pre-flight with
the others (:mod:`corral.checks.spares`); a spare that fails it is not used.

This module decides; :mod:`corral.job.inplace` (the supervisor of such an attempt)
acts. :class:`GroupLog` keeps what happened for the events and the summary
(``node local-2 lost at step 57, rejoined at step 71 healed from local-0; 0 steps
redone``).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

from corral.contract import FT_QUORUM_RETRIES_ENV
from corral.defaults import DEFAULT_FT_JOIN_TIMEOUT
from corral.errors import ConfigError

RECOVERY_MODES: tuple[str, ...] = ("restart", "in-place")
INPLACE_LAUNCHERS: tuple[str, ...] = ("torchrun", "python")
"""Launchers whose node command corral can start as one single-node replica group."""
MAX_GROUP_RESTARTS = 3
"""In-place restarts of a group on one host before the host is given up (a spare, or
the job goes on without it)."""
MAX_LIGHTHOUSE_RESTARTS = 3
"""Restarts of a Lighthouse that died, in one attempt, before the attempt falls back to
a restart of every node from the disk checkpoint."""
DAY = 86400
"""The longest ``--ft-join-timeout`` (seconds)."""
TORCHFT_INSTALL = "python -m pip install torchft-nightly"
"""How a host gets torchft (the pre-flight names it when torchft is missing)."""

Recovery = Literal["restart", "in-place"]
Action = Literal["restart", "continue", "fallback"]


@dataclass(frozen=True)
class RecoveryPolicy:
    """``--recovery`` (``restart``: every failure restarts the whole job;
    ``in-place``: only the failed node's replica group), ``--spares`` and
    ``--ft-join-timeout`` (None: the default, :attr:`join_seconds`)."""

    mode: str = "restart"
    spares: int = 0
    join_timeout: float | None = None

    def __post_init__(self) -> None:
        if self.mode not in RECOVERY_MODES:
            raise ConfigError(
                f"unknown recovery {self.mode!r}; choose one of {', '.join(RECOVERY_MODES)}",
                option="--recovery",
            )
        if self.spares < 0:
            raise ConfigError(f"must be 0 or more (got {self.spares})", option="--spares")
        if self.spares and self.mode != "in-place":
            raise ConfigError(
                "spare hosts replace a lost node's replica group: needs --recovery in-place",
                option="--spares",
            )
        join = self.join_timeout
        if join is not None:
            if self.mode != "in-place":
                raise ConfigError(
                    "torchft's Lighthouse runs only for --recovery in-place",
                    option="--ft-join-timeout",
                )
            if isinstance(join, bool) or not isinstance(join, int | float) or not 0 < join <= DAY:
                raise ConfigError(
                    f"must be more than 0 and at most {DAY} seconds (got {join!r})",
                    option="--ft-join-timeout",
                )

    @property
    def join_seconds(self) -> float:
        """How long torchft's Lighthouse waits for a heartbeating group that has not asked
        for the next quorum yet (``--ft-join-timeout``, default 10 s)."""
        return DEFAULT_FT_JOIN_TIMEOUT if self.join_timeout is None else float(self.join_timeout)

    @property
    def in_place(self) -> bool:
        """True for ``--recovery in-place``."""
        return self.mode == "in-place"

    def check(self, launcher: str, hosts: int, min_nodes: int | None) -> None:
        """Refuse what in-place recovery cannot run (ConfigError naming the option)."""
        if not self.in_place:
            return
        if launcher not in INPLACE_LAUNCHERS:
            raise ConfigError(
                f"the {launcher} launcher cannot start a node as its own replica group; "
                f"use --launcher {' or '.join(INPLACE_LAUNCHERS)}",
                option="--recovery",
            )
        groups = hosts - self.spares
        if self.spares and groups < 1:
            raise ConfigError(
                f"{self.spares} spare(s) leave no host of the {hosts} to train on",
                option="--spares",
            )
        if groups < 2:
            raise ConfigError(
                f"in-place recovery needs at least 2 nodes to train on (got {groups}): with one "
                "replica group there is no live peer to continue or heal from; use "
                "--recovery restart",
                option="--recovery",
            )
        if min_nodes is not None and min_nodes > groups:
            raise ConfigError(
                f"{min_nodes} is more than the {groups} nodes that train "
                f"({hosts} hosts, {self.spares} spare)",
                option="--min-nodes",
            )

    @staticmethod
    def min_replicas(min_nodes: int | None) -> int:
        """The Lighthouse's ``min_replicas``: ``--min-nodes``, else 1 (any live group
        keeps training)."""
        return max(1, min_nodes or 1)


@dataclass(frozen=True)
class GroupDecision:
    """What follows the loss of one replica group: ``restart`` it on ``host``,
    ``continue`` without it, or ``fallback`` to a restart of the whole job."""

    action: Action
    reason: str
    host: str | None = None


def decide_group(
    *,
    host: str,
    live: int,
    min_nodes: int | None,
    host_answers: bool,
    restarts_on_host: int,
    spares: Sequence[str],
    lighthouse_alive: bool = True,
    finished: bool = False,
) -> GroupDecision:
    """After the group on ``host`` was torn down: ``live`` groups still run; the
    host answered a ping (``host_answers``); its group was restarted there
    ``restarts_on_host`` times already; ``spares`` are the free spare hosts;
    ``finished``: a group already ended its training (nothing to rejoin)."""
    need = RecoveryPolicy.min_replicas(min_nodes)
    if not lighthouse_alive:
        return GroupDecision("fallback", "the torchft Lighthouse is gone")
    if live < need:
        return GroupDecision(
            "fallback",
            f"only {live} replica group(s) remain, fewer than --min-nodes {need}",
        )
    if finished:
        return GroupDecision("continue", "the other groups finished training: nothing to rejoin")
    if host_answers and restarts_on_host < MAX_GROUP_RESTARTS:
        return GroupDecision("restart", f"restarting its group on {host}", host)
    if spares:
        why = "does not answer" if not host_answers else f"failed {restarts_on_host} times"
        return GroupDecision(
            "restart", f"{host} {why}: restarting its group on spare {spares[0]}", spares[0]
        )
    why = "does not answer" if not host_answers else f"failed {restarts_on_host} times"
    return GroupDecision(
        "continue", f"{host} {why} and no spare host is left: {live} group(s) go on without it"
    )


def lighthouse_fallback(code: int, restarts: int, retries: str | None) -> str | None:
    """Why the Lighthouse that exited with ``code`` is not restarted (the fallback's
    reason), or None: restart it at the same address, the groups reconnect.
    ``restarts``: how many times it was restarted in this attempt; ``retries``: the
    groups' ``TORCHFT_QUORUM_RETRIES`` (torchft's Managers reconnect to a new
    Lighthouse only by retrying a failed quorum: with 0 they fail instead)."""
    lost = f"torchft's Lighthouse exited (code {code})"
    if retries is not None and retries.strip() == "0":
        return (
            f"{lost} and the groups cannot reconnect to a new one: the job's env sets "
            f"{FT_QUORUM_RETRIES_ENV}=0 (torchft's Managers then fail on the first quorum "
            "without it; leave it unset to let corral restart the Lighthouse)"
        )
    if restarts >= MAX_LIGHTHOUSE_RESTARTS:
        return f"{lost} again after {restarts} restart(s) in this attempt"
    return None


# torchft's manager log line of a group that heals from a live peer
_HEALING = re.compile(
    r"healing is required step=(\d+), max_step=(\d+), recover_src_replica_rank=(\d+)"
)


def parse_healing(text: str) -> tuple[int, int, int] | None:
    """``(step, max_step, source replica rank)`` of torchft's "healing is required"
    line, or None."""
    match = _HEALING.search(text)
    if match is None:
        return None
    return int(match.group(1)), int(match.group(2)), int(match.group(3))


# the source of a healing group's checkpoint: torchft's Rust line above (RUST_LOG=info)
# or its Python manager's, which the ranks show at any level (the SDK keeps it)
_SOURCE = re.compile(
    r"(?:fetching checkpoint from |healing is required .*?)recover_src_replica_rank=(\d+)"
)
HEALING_MARKER = b"recover_src_replica_rank="
"""What every line :func:`healing_source` reads contains."""


def healing_source(text: str) -> int | None:
    """The replica rank (the index of the peer in the quorum) a healing group fetches
    its checkpoint from, from torchft's log lines in ``text``; None without one."""
    match = _SOURCE.search(text)
    return int(match.group(1)) if match is not None else None


@dataclass
class GroupEpisode:
    """One loss of a replica group and what followed."""

    group: int
    host: str
    lost_step: int | None  # the survivors' latest step when it was lost
    lost_time: float
    cause: str
    action: str = ""  # restart | continue | fallback
    restarted_on: str | None = None
    rejoined_step: int | None = None
    rejoined_time: float | None = None
    healed_from: str | None = None
    next_step: int | None = None  # the survivors' first step after the loss
    next_step_time: float | None = None
    before: dict[int, int] = field(default_factory=dict)  # each survivor's last step
    redone: int | None = None  # the most steps a survivor trained again
    lost_again: bool = False  # its restarted group failed too before it rejoined

    @property
    def steps_redone(self) -> int | None:
        """Steps the survivors trained twice (0 in place: they never go back)."""
        return self.redone

    def line(self) -> str:
        """``node local-2 lost at step 57, rejoined at step 71 healed from local-0; 0
        steps redone``."""
        at = f" at step {self.lost_step}" if self.lost_step is not None else ""
        text = f"node {self.host} lost{at}"
        if self.rejoined_step is not None:
            where = (
                f" on {self.restarted_on}"
                if self.restarted_on and self.restarted_on != self.host
                else ""
            )
            healed = f" healed from {self.healed_from}" if self.healed_from else ""
            text += f", rejoined{where} at step {self.rejoined_step}{healed}"
        elif self.lost_again:
            text += ", lost again before it rejoined (next line)"
        elif self.action == "fallback":
            text += ", fell back to a restart from the disk checkpoint"
        elif self.action == "continue":
            text += ", not rejoined (the others went on without it)"
        else:
            text += ", not rejoined before the job ended"
        redone = self.steps_redone
        if redone is not None:
            text += f"; {redone} step{'' if redone == 1 else 's'} redone"
        return text


@dataclass
class GroupLog:
    """Every group episode of an attempt, in order."""

    episodes: list[GroupEpisode] = field(default_factory=list)

    def lost(
        self, group: int, host: str, before: dict[int, int], when: float, cause: str
    ) -> GroupEpisode:
        """Record the loss of ``group`` on ``host``; ``before``: each surviving group's
        latest step then."""
        step = max(before.values()) if before else None
        previous = self.open_for(group)
        if previous is not None and previous.restarted_on is not None:
            previous.lost_again = True  # its restart failed while it healed
        episode = GroupEpisode(group, host, step, when, cause, before=dict(before))
        self.episodes.append(episode)
        return episode

    def open_for(self, group: int) -> GroupEpisode | None:
        """The latest episode of ``group`` not yet closed by its rejoin."""
        for episode in reversed(self.episodes):
            if episode.group == group:
                return episode if episode.rejoined_step is None else None
        return None

    def survivors_stepped(self, group: int, step: int, when: float) -> None:
        """Surviving ``group`` reported ``step``: its first report after a loss says
        how many steps it trained again (its step before minus this one, plus one)."""
        for episode in self.episodes:
            last = episode.before.pop(group, None)
            if last is None:
                continue
            if episode.next_step is None:
                episode.next_step, episode.next_step_time = step, when
            episode.redone = max(episode.redone or 0, last - step + 1)

    def lines(self) -> list[str]:
        """The summary's lines, one per episode."""
        return [e.line() for e in self.episodes]

    def to_json(self) -> list[dict[str, Any]]:
        """Every episode as JSON (``result.json``, the API)."""
        return [{**asdict(e), "steps_redone": e.steps_redone} for e in self.episodes]


def episode_lines(records: Sequence[dict[str, Any]]) -> list[str]:
    """The summary's lines of group episodes as ``JobResult.groups`` holds them."""
    names = set(GroupEpisode.__dataclass_fields__)
    lines = []
    for record in records:
        episode = GroupEpisode(**{k: v for k, v in record.items() if k in names})
        lines.append(episode.line())
    return lines


# the replica id a torchft Manager of group G heartbeats with: corral's ``corral_G``
# (sdk.fault_tolerant, or a script's own Manager given it) plus torchft's ``:uuid``
_REPLICA_ID = re.compile(r"^corral_(\d+)(?::|$)")

JOIN_FIX = (
    "call sdk.fault_tolerant(...) (or create a torchft Manager) in the script, "
    "or run without --recovery in-place"
)
"""What the error says when replica groups never joined torchft's quorum."""


def replica_group(replica_id: str) -> int | None:
    """The replica group a Lighthouse member's id names (``corral_2:<uuid>`` -> 2), or
    None for an id corral did not give (a script's own Manager with its own id)."""
    match = _REPLICA_ID.match(replica_id)
    return int(match.group(1)) if match else None


@dataclass
class JoinWatch:
    """Which started replica groups have joined torchft's quorum (pure bookkeeping).

    A group has joined once its Manager heartbeats the Lighthouse (a member id not
    seen before, :meth:`seen`) or one of its ranks reported to corral
    (:meth:`joined`). A group that has not joined ``timeout`` seconds after it was
    started is :meth:`overdue`: its script never created the torchft Manager. Members
    with ids corral did not give count for any overdue group (a script's own Manager
    with its own ``replica_id``)."""

    timeout: float
    pending: dict[int, tuple[int, str, float]] = field(default_factory=dict)
    known: set[str] = field(default_factory=set)
    anonymous: int = 0  # members with foreign ids not yet matched to a group

    def started(self, key: int, group: int, host: str, now: float) -> None:
        """Node ``key`` (group ``group`` on ``host``) was started at ``now``."""
        self.pending[key] = (group, host, now)

    def joined(self, key: int) -> None:
        """Node ``key`` has joined (or is gone: nothing to wait for)."""
        self.pending.pop(key, None)

    def seen(self, members: set[str], newest: dict[int, int]) -> None:
        """The Lighthouse's members now; ``newest``: each group's current node key."""
        for member in sorted(members - self.known):
            self.known.add(member)
            group = replica_group(member)
            key = newest.get(group) if group is not None else None
            if key is not None and key in self.pending:
                self.joined(key)
            elif group is None:
                self.anonymous += 1

    def overdue(self, now: float) -> list[tuple[int, str]]:
        """``(group, host)`` of every node that has not joined within the timeout
        (after foreign members are matched to overdue nodes, oldest first)."""
        late = sorted(
            (k for k, (_, _, t) in self.pending.items() if now - t >= self.timeout),
            key=lambda k: self.pending[k][2],
        )
        while late and self.anonymous:
            self.anonymous -= 1
            self.joined(late.pop(0))
        return [(self.pending[k][0], self.pending[k][1]) for k in late]


def never_joined(late: Sequence[tuple[int, str]], timeout: float, option: str) -> str:
    """The error of groups that never joined torchft's quorum, with the fix."""
    names = ", ".join(f"group {g} ({h})" for g, h in late)
    return (
        f"{names} never joined torchft's quorum within {timeout:g} s ({option}): the "
        f"script never created a torchft Manager; {JOIN_FIX}"
    )
