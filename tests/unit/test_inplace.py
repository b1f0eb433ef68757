"""In-place recovery (torchft): the policy, its decisions, the group plan, and the
in-place supervisor against the scripted fake transport (no process is started)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from corral.cluster import Cluster, Host
from corral.contract import (
    LIGHTHOUSE_ENV,
    MIN_REPLICAS_ENV,
    REPLICA_GROUP_ENV,
    REPLICA_GROUPS_ENV,
    STATE_MISMATCH,
)
from corral.errors import ConfigError, LaunchError
from corral.job.build import build_job, new_job
from corral.job.describe import JobOptions
from corral.job.events import GroupChanged, JobEvent, decode_event, json_of
from corral.job.inplace import ReplicaGroupSupervisor
from corral.job.logfiles import LogFiles
from corral.job.states import JobState
from corral.plan.inplace import plan_group, plan_groups
from corral.plan.spec import JobSpec
from corral.recovery.inplace import (
    MAX_GROUP_RESTARTS,
    GroupLog,
    decide_group,
    parse_healing,
)
from corral.sdk import StateMismatch
from corral.transport.fake import FakeNode, FakeTransport

HOSTS = ("a", "b", "c")


def _cluster(n: int = 3) -> Cluster:
    return Cluster(tuple(Host(f"h{i}", address=f"10.0.0.{i + 1}") for i in range(n)))


# -- the policy: what is refused, with the option named ----------------------------------


def test_one_node_is_refused_with_the_reason() -> None:
    spec, made = build_job(JobOptions(command=("t.py",), recovery="in-place"))
    with pytest.raises(ConfigError) as err:
        new_job(spec, _cluster(1), made)
    assert err.value.option == "--recovery"
    assert "at least 2 nodes" in str(err.value) and "no live peer" in str(err.value)


def test_launchers_that_cannot_carry_a_group_are_refused() -> None:
    with pytest.raises(ConfigError) as err:
        build_job(
            JobOptions(command=(), launcher="command", command_template="run", recovery="in-place")
        )
    assert err.value.option == "--recovery" and "torchrun or python" in str(err.value)
    build_job(JobOptions(command=("t.py",), launcher="python", recovery="in-place"))


def test_spares_need_in_place_and_leave_two_nodes() -> None:
    with pytest.raises(ConfigError) as err:
        build_job(JobOptions(command=("t.py",), spares=1))
    assert err.value.option == "--spares"
    with pytest.raises(ConfigError) as err:
        build_job(JobOptions(command=("t.py",), recovery="bogus"))
    assert err.value.option == "--recovery"
    spec, made = build_job(JobOptions(command=("t.py",), recovery="in-place", spares=2))
    with pytest.raises(ConfigError, match="at least 2 nodes"):
        new_job(spec, _cluster(3), made)
    job = new_job(spec, _cluster(4), made)
    assert [h.name for h in job.cluster.hosts] == ["h0", "h1"]
    assert [h.name for h in job.spares] == ["h2", "h3"]


def test_min_nodes_above_the_training_nodes_is_refused() -> None:
    spec, made = build_job(
        JobOptions(command=("t.py",), recovery="in-place", spares=1, min_nodes=3)
    )
    with pytest.raises(ConfigError) as err:
        new_job(spec, _cluster(3), made)
    assert err.value.option == "--min-nodes"


# -- the decisions --------------------------------------------------------------------


def _decide(**kw: Any) -> Any:
    base: dict[str, Any] = {
        "host": "h2",
        "live": 2,
        "min_nodes": None,
        "host_answers": True,
        "restarts_on_host": 0,
        "spares": [],
    }
    return decide_group(**{**base, **kw})


def test_a_lost_group_restarts_on_its_host_when_it_answers() -> None:
    d = _decide()
    assert d.action == "restart" and d.host == "h2"


def test_an_unanswering_host_is_replaced_by_a_spare() -> None:
    d = _decide(host_answers=False, spares=["s0", "s1"])
    assert d.action == "restart" and d.host == "s0" and "does not answer" in d.reason
    d = _decide(restarts_on_host=MAX_GROUP_RESTARTS, spares=["s0"])
    assert d.action == "restart" and d.host == "s0"


def test_without_a_spare_the_others_go_on() -> None:
    d = _decide(host_answers=False)
    assert d.action == "continue" and "no spare" in d.reason


def test_below_min_nodes_or_without_lighthouse_falls_back() -> None:
    d = _decide(live=1, min_nodes=2)
    assert d.action == "fallback" and "--min-nodes 2" in d.reason
    d = _decide(lighthouse_alive=False)
    assert d.action == "fallback" and "Lighthouse" in d.reason


def test_nothing_rejoins_a_finished_training() -> None:
    assert _decide(finished=True).action == "continue"


def test_healing_line_and_summary_lines() -> None:
    line = "[Replica corral_2] healing is required step=0, max_step=71, recover_src_replica_rank=0"
    assert parse_healing(line) == (0, 71, 0)
    assert parse_healing("nothing") is None
    log = GroupLog()
    episode = log.lost(2, "local-2", {0: 57, 1: 56}, 100.0, "rank 0 killed")
    episode.restarted_on = "local-2"
    log.survivors_stepped(0, 58, 101.0)
    log.survivors_stepped(1, 57, 101.0)
    episode.rejoined_step, episode.healed_from = 71, "local-0"
    assert log.lines() == [
        "node local-2 lost at step 57, rejoined at step 71 healed from local-0; 0 steps redone"
    ]
    redo = log.lost(1, "local-1", {0: 80}, 200.0, "x")
    log.survivors_stepped(0, 78, 201.0)  # a survivor that went back (restart path)
    assert redo.steps_redone == 3
    assert log.to_json()[1]["steps_redone"] == 3
    # a restarted group lost again while it heals: the first episode says so
    again = GroupLog()
    first = again.lost(2, "h2", {0: 9, 1: 9}, 1.0, "killed")
    first.restarted_on = "h2"
    second = again.lost(2, "h2", {0: 11, 1: 11}, 2.0, "killed while healing")
    second.restarted_on, second.rejoined_step, second.healed_from = "h2", 29, "h0"
    assert again.lines() == [
        "node h2 lost at step 9, lost again before it rejoined (next line)",
        "node h2 lost at step 11, rejoined at step 29 healed from h0",
    ]


# -- the plan --------------------------------------------------------------------------


def test_every_node_is_its_own_single_node_group() -> None:
    spec = JobSpec(script="t.py", job_id="j", python="python3", workdir="/w")
    commands = plan_groups(
        spec,
        _cluster(3),
        ports=[29500, 29500, 29500],
        lighthouse="http://10.0.0.9:7",
        min_replicas=2,
    )
    for index, command in enumerate(commands):
        assert "--nnodes=1" in command.argv
        assert f"--rdzv-endpoint=10.0.0.{index + 1}:29500" in command.argv
        assert command.env["MASTER_ADDR"] == f"10.0.0.{index + 1}"
        assert command.env[LIGHTHOUSE_ENV] == "http://10.0.0.9:7"
        assert command.env[REPLICA_GROUP_ENV] == str(index)
        assert command.env[REPLICA_GROUPS_ENV] == "3"
        assert command.env[MIN_REPLICAS_ENV] == "2"
        assert command.node_rank == index and command.hosts_master
    python = dataclass_replace(spec, launcher="python")
    one = plan_group(
        python,
        Host("s", address="10.0.0.7"),
        1,
        groups=3,
        port=4000,
        lighthouse="h",
        min_replicas=1,
    )
    assert one.env["WORLD_SIZE"] == "1" and one.env["MASTER_PORT"] == "4000"
    assert one.env[REPLICA_GROUP_ENV] == "1" and one.ranks[0].env["RANK"] == "0"


def test_groups_get_torchfts_conventional_names_and_the_users_own_win() -> None:
    # a script written for torchft reads REPLICA_GROUP_ID / NUM_REPLICA_GROUPS
    spec = JobSpec(script="t.py", job_id="j", python="python3", workdir="/w")
    commands = plan_groups(
        spec, _cluster(3), ports=[1, 1, 1], lighthouse="http://x:1", min_replicas=1
    )
    assert [c.env["REPLICA_GROUP_ID"] for c in commands] == ["0", "1", "2"]
    assert {c.env["NUM_REPLICA_GROUPS"] for c in commands} == {"3"}
    assert {c.env["TORCHFT_LIGHTHOUSE"] for c in commands} == {"http://x:1"}
    # a value the job's --env or the host's env sets wins (corral's own names stay)
    mine = dataclass_replace(spec, env={"NUM_REPLICA_GROUPS": "8"})
    host = Host("h", address="10.0.0.5", env={"REPLICA_GROUP_ID": "5"})
    one = plan_group(mine, host, 1, groups=3, port=1, lighthouse="x", min_replicas=1)
    assert one.env["REPLICA_GROUP_ID"] == "5" and one.env["NUM_REPLICA_GROUPS"] == "8"
    assert one.env[REPLICA_GROUP_ENV] == "1" and one.env[REPLICA_GROUPS_ENV] == "3"


def dataclass_replace(spec: JobSpec, **kw: Any) -> JobSpec:
    import dataclasses

    return dataclasses.replace(spec, **kw)


def test_group_events_round_trip() -> None:
    event = GroupChanged(job_id="j", host="a", group=1, change="rejoined", participants=3, step=9)
    back = decode_event(json_of(event), "j")
    assert isinstance(back, GroupChanged) and back.step == 9 and back.participants == 3


# -- the supervisor against the scripted fake transport --------------------------------


class FakeLighthouse:
    """Stands in for the Lighthouse child: alive until ``die()``; ``restart()`` brings
    it back unless ``restartable`` is False (then it raises as a failed start does)."""

    url = "http://127.0.0.1:1"

    def __init__(self, members: set[str] | None = None, *, restartable: bool = True) -> None:
        self._exit: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        self.member_ids: set[str] = set(members or ())
        self.restartable = restartable
        self.restarts = 0

    async def restart(self) -> None:
        if not self.restartable:
            raise LaunchError("could not start torchft's Lighthouse: address already in use")
        self._exit = asyncio.get_running_loop().create_future()
        self.restarts += 1

    async def members(self) -> set[str] | None:
        return set(self.member_ids)

    @property
    def alive(self) -> bool:
        return not self._exit.done()

    def die(self) -> None:
        self._exit.set_result(-9)

    async def wait(self) -> int:
        return await asyncio.shield(self._exit)

    async def close(self) -> None:
        if not self._exit.done():
            self._exit.set_result(0)


async def _until(condition: Callable[[], bool], deadline: float = 20.0) -> None:
    end = time.monotonic() + deadline
    while not condition():
        assert time.monotonic() < end, "condition not reached in time"
        await asyncio.sleep(0.01)


def _commands() -> list[Any]:
    spec = JobSpec(script="t.py", launcher="python", job_id="j", python="python3", workdir="/w")
    cluster = Cluster(tuple(Host(h, address=f"10.77.0.{i + 1}") for i, h in enumerate(HOSTS)))
    return plan_groups(spec, cluster, ports=[1, 1, 1], lighthouse="http://x:1", min_replicas=1)


def _begin(node: FakeNode) -> None:
    """The node's agent started and its one rank with it."""
    node.event("started", pid=1, pgids=[1])
    node.event("rank_start", rank=0, local_rank=0, pid=1)


def _end(node: FakeNode, code: int) -> None:
    """The node's one rank exited with ``code``, and its agent with it."""
    node.event("rank_exit", rank=0, code=code, eof_time=time.time())
    node.event("node_exit", ranks={})


async def _stop_on_request(node: FakeNode) -> int:
    await node.next_op("stop")
    _end(node, -15)
    return 0


async def _supervise(
    behaviours: dict[str, Any], tmp_path: Path, **kw: Any
) -> tuple[Any, list[JobEvent], FakeTransport]:
    events: list[JobEvent] = []
    transport = FakeTransport(behaviours)
    lighthouse = kw.pop("lighthouse", None) or FakeLighthouse()
    spec = JobSpec(script="t.py", launcher="python", job_id="j", python="python3", workdir="/w")

    def replan(group: int, host: Host) -> Any:
        return plan_group(spec, host, group, groups=3, port=1, lighthouse="x", min_replicas=1)

    sup = ReplicaGroupSupervisor(
        _commands(),
        transport,
        events.append,
        logs=LogFiles(tmp_path / "logs"),
        job_id="j",
        agent_argv=lambda h: ["python3", "-m", "corral.agent"],
        heartbeat_interval=0.05,
        grace=1.0,
        lighthouse=lighthouse,
        replan=replan,
        **kw,
    )
    kw_state["sup"] = sup
    result = await asyncio.wait_for(sup.run(), 30)
    return result, events, transport


kw_state: dict[str, Any] = {}


def test_a_killed_group_is_restarted_alone_and_rejoins(tmp_path: Path) -> None:
    rejoined = asyncio.Event()
    lives = {"c": 0}

    async def survivor(node: FakeNode) -> int:
        _begin(node)
        node.event("report", rank=0, type="progress", step=5)
        await rejoined.wait()  # they never stop while c is away
        node.event("report", rank=0, type="progress", step=6)
        node.event("report", rank=0, type="progress", step=8)
        _end(node, 0)
        return 0

    async def victim(node: FakeNode) -> int:
        lives["c"] += 1
        _begin(node)
        if lives["c"] == 1:
            node.event("report", rank=0, type="progress", step=5)
            _end(node, -9)
            return 0
        node.err(0, "healing is required step=0, max_step=7, recover_src_replica_rank=0\n")
        node.event("report", rank=0, type="progress", step=8)
        rejoined.set()
        _end(node, 0)
        return 0

    result, events, _ = asyncio.run(
        _supervise({"a": survivor, "b": survivor, "c": victim}, tmp_path)
    )
    assert result.state == JobState.SUCCEEDED and result.exit_code == 0
    assert lives["c"] == 2
    changes = [(e.change, e.host, e.participants) for e in events if isinstance(e, GroupChanged)]
    assert changes == [("lost", "c", 2), ("restarting", "c", 2), ("rejoined", "c", 3)]
    rejoin = next(e for e in events if isinstance(e, GroupChanged) and e.change == "rejoined")
    assert rejoin.step == 8 and rejoin.healed_from == "a"
    assert result.groups[0]["steps_redone"] == 0
    sup = kw_state["sup"]
    assert sup.groups.lines() == [
        "node c lost at step 5, rejoined at step 8 healed from a; 0 steps redone"
    ]


def test_a_rejoin_names_its_peer_when_the_heal_line_comes_after_the_first_step(
    tmp_path: Path,
) -> None:
    # the rank's log line (torchft's "healing ... recover_src_replica_rank=") and its
    # progress report travel on different streams: the report may arrive first, and the
    # rejoin is still announced once, with the peer it healed from
    rejoined = asyncio.Event()
    lives = {"c": 0}

    async def survivor(node: FakeNode) -> int:
        _begin(node)
        node.event("report", rank=0, type="progress", step=5)
        await rejoined.wait()
        node.event("report", rank=0, type="progress", step=9)
        _end(node, 0)
        return 0

    async def victim(node: FakeNode) -> int:
        lives["c"] += 1
        _begin(node)
        if lives["c"] == 1:
            node.event("report", rank=0, type="progress", step=5)
            _end(node, -9)
            return 0
        node.event("report", rank=0, type="progress", step=8)
        await asyncio.sleep(0.2)
        node.err(0, "healing is required step=0, max_step=7, recover_src_replica_rank=0\n")
        node.event("report", rank=0, type="progress", step=9)
        rejoined.set()
        _end(node, 0)
        return 0

    result, events, _ = asyncio.run(
        _supervise({"a": survivor, "b": survivor, "c": victim}, tmp_path)
    )
    assert result.state == JobState.SUCCEEDED
    rejoins = [e for e in events if isinstance(e, GroupChanged) and e.change == "rejoined"]
    assert [(e.step, e.healed_from) for e in rejoins] == [(8, "a")]


def test_a_rejoin_names_its_peer_when_the_peers_finished_before_its_heal_line(
    tmp_path: Path,
) -> None:
    # the peers that served the heal may have finished training by the time its line
    # is read: torchft's source index still counts them among the quorum's groups
    lives = {"c": 0}
    back, done = asyncio.Event(), {"a": asyncio.Event(), "b": asyncio.Event()}

    def survivor(name: str) -> Any:
        async def run(node: FakeNode) -> int:
            _begin(node)
            node.event("report", rank=0, type="progress", step=5)
            await back.wait()
            node.event("report", rank=0, type="progress", step=8)
            _end(node, 0)
            done[name].set()
            return 0

        return run

    async def victim(node: FakeNode) -> int:
        lives["c"] += 1
        _begin(node)
        if lives["c"] == 1:
            node.event("report", rank=0, type="progress", step=5)
            _end(node, -9)
            return 0
        back.set()
        await done["a"].wait()
        await done["b"].wait()
        sup = kw_state["sup"]
        await _until(lambda: sum(n.state.terminal for n in sup.nodes) >= 3)
        node.err(0, "healing is required step=0, max_step=7, recover_src_replica_rank=1\n")
        node.event("report", rank=0, type="progress", step=8)
        _end(node, 0)
        return 0

    result, events, _ = asyncio.run(
        _supervise({"a": survivor("a"), "b": survivor("b"), "c": victim}, tmp_path)
    )
    assert result.state == JobState.SUCCEEDED
    rejoins = [e for e in events if isinstance(e, GroupChanged) and e.change == "rejoined"]
    assert [(e.step, e.healed_from) for e in rejoins] == [(8, "b")]


def test_below_min_nodes_the_attempt_falls_back_to_a_restart(tmp_path: Path) -> None:
    async def survivor(node: FakeNode) -> int:
        _begin(node)
        return await _stop_on_request(node)

    async def victim(node: FakeNode) -> int:
        _begin(node)
        _end(node, -9)
        return 0

    result, events, transport = asyncio.run(
        _supervise({"a": survivor, "b": survivor, "c": victim}, tmp_path, min_nodes=3)
    )
    assert result.state == JobState.FAILED
    assert "falling back to a restart of every node" in result.failures[0].message
    # the cause keeps what took the last group down (e.g. a StateMismatch's words)
    assert result.failures[0].message.endswith("(group 2 lost: rank 0 on c killed by SIGKILL)")
    assert [e.change for e in events if isinstance(e, GroupChanged)] == ["lost", "fallback"]
    assert all(n.received[-1]["op"] in ("stop", "kill", "hb") for n in transport.nodes.values())


def test_groups_whose_states_differ_after_a_heal_end_the_attempt(tmp_path: Path) -> None:
    # a StateMismatch (sdk.fault_tolerant's digest check) would recur on every heal:
    # the attempt ends, named, instead of restarting the group to heal the same way
    async def survivor(node: FakeNode) -> int:
        _begin(node)
        return await _stop_on_request(node)

    async def mismatched(node: FakeNode) -> int:
        _begin(node)
        error = {"traceback": "corral.sdk._ftstate.StateMismatch: ... 'sampler' (group 0: 1)"}
        node.event("rank_exit", rank=0, code=1, eof_time=time.time(), error=error)
        return await _stop_on_request(node)

    result, events, _ = asyncio.run(
        _supervise({"a": survivor, "b": survivor, "c": mismatched}, tmp_path)
    )
    assert result.state == JobState.FAILED and result.exit_code == 1
    cause = result.failures[0]
    assert (cause.host, cause.rank) == ("c", 0) and "'sampler'" in (cause.traceback or "")
    assert not [e for e in events if isinstance(e, GroupChanged) and e.change == "restarting"]
    assert StateMismatch.__name__ == STATE_MISMATCH  # the name the supervisor looks for


def test_a_dead_lighthouse_that_cannot_be_restarted_falls_back_saying_why(
    tmp_path: Path,
) -> None:
    async def survivor(node: FakeNode) -> int:
        _begin(node)
        return await _stop_on_request(node)

    async def main() -> Any:
        lighthouse = FakeLighthouse(restartable=False)
        asyncio.get_running_loop().call_later(0.3, lighthouse.die)
        return await _supervise({h: survivor for h in HOSTS}, tmp_path, lighthouse=lighthouse)

    result, _, _ = asyncio.run(main())
    assert result.state == JobState.FAILED
    assert result.failures[0].message.startswith(
        "torchft's Lighthouse exited (code -9) and could not be restarted: could not start "
        "torchft's Lighthouse: address already in use: falling back to a restart of every "
        "node from the disk checkpoint"
    )


def test_a_dead_lighthouse_is_restarted_and_the_groups_train_on(tmp_path: Path) -> None:
    lighthouse: FakeLighthouse | None = None

    async def trains_on(node: FakeNode) -> int:
        _begin(node)
        node.event("report", rank=0, type="progress", step=5)
        assert lighthouse is not None
        await _until(lambda: lighthouse.restarts == 2)  # it died twice, came back twice
        node.event("report", rank=0, type="progress", step=6)
        _end(node, 0)
        return 0

    async def main() -> Any:
        nonlocal lighthouse
        lighthouse = FakeLighthouse()
        loop = asyncio.get_running_loop()
        loop.call_later(0.3, lighthouse.die)
        loop.call_later(0.8, lambda: lighthouse.die() if lighthouse else None)
        return await _supervise({h: trains_on for h in HOSTS}, tmp_path, lighthouse=lighthouse)

    result, events, _ = asyncio.run(main())
    assert result.state == JobState.SUCCEEDED  # no restart from disk
    said = [getattr(e, "text", "") for e in events]
    assert any(
        t.startswith("torchft's Lighthouse exited (code -9): corral restarted it at ")
        and "the groups reconnect to it, no restart from disk" in t
        for t in said
    ), said
    assert not [e for e in events if isinstance(e, GroupChanged) and e.change == "fallback"]


# -- a script that never creates the torchft Manager: named after the join timeout ----------


def test_groups_that_never_join_the_quorum_are_named_with_the_fix(tmp_path: Path) -> None:
    from corral.job.result import EXIT_LAUNCH
    from corral.recovery.inplace import JOIN_FIX

    async def silent(node: FakeNode) -> int:  # runs, never joins, never reports
        _begin(node)
        return await _stop_on_request(node)

    async def reporter(node: FakeNode) -> int:  # its ranks report: it is training
        _begin(node)
        node.event("report", rank=0, type="progress", step=1)
        return await _stop_on_request(node)

    async def main() -> Any:
        # b's Manager heartbeats the Lighthouse (corral's replica id + torchft's uuid)
        lighthouse = FakeLighthouse({"corral_1:8f2e"})
        return await _supervise(
            {"a": silent, "b": silent, "c": reporter},
            tmp_path,
            lighthouse=lighthouse,
            join_timeout=0.3,
            join_poll=0.05,
        )

    result, events, transport = asyncio.run(main())
    assert result.state == JobState.FAILED and result.exit_code == EXIT_LAUNCH
    message = result.failures[0].message
    assert message.startswith("group 0 (a) never joined torchft's quorum within 0.3 s")
    assert "(--rdzv-timeout)" in message and JOIN_FIX in message
    assert "group 1" not in message and "group 2" not in message
    assert result.failures[0].host == "a"
    assert not [e for e in events if isinstance(e, GroupChanged)]  # no group was "lost"
    assert all(n.received[-1]["op"] in ("stop", "kill", "hb") for n in transport.nodes.values())


def test_a_scripts_own_manager_ids_count_as_joined(tmp_path: Path) -> None:
    async def own_manager(node: FakeNode) -> int:
        _begin(node)
        sup = kw_state["sup"]
        await _until(lambda: not sup.joins.pending)
        _end(node, 0)
        return 0

    async def main() -> Any:
        # three Managers with the script's own replica ids: one per group, whichever
        lighthouse = FakeLighthouse({"mine:1", "mine:2", "mine:3"})
        return await _supervise(
            {h: own_manager for h in HOSTS},
            tmp_path,
            lighthouse=lighthouse,
            join_timeout=0.2,
            join_poll=0.05,
        )

    result, _, _ = asyncio.run(main())
    assert result.state == JobState.SUCCEEDED, result.failures


def test_join_bookkeeping() -> None:
    from corral.recovery.inplace import JoinWatch, replica_group
    from corral.recovery.lighthouse import parse_members

    assert replica_group("corral_12:5c1d-uuid") == 12 and replica_group("corral_3") == 3
    assert replica_group("corral_x") is None and replica_group("mine:corral_1") is None
    page = (
        '<h2>Heartbeats</h2>\n<ul>\n  <li class="heartbeat\n  ">\n'
        "    corral_1:ab: seen 0.0021s ago\n  </li>\n"
    )
    assert parse_members(page) == {"corral_1:ab"}
    watch = JoinWatch(10.0)
    watch.started(100, 0, "h0", 0.0)
    watch.started(101, 1, "h1", 0.0)
    watch.seen({"corral_1:a"}, {0: 100, 1: 101})
    assert watch.overdue(5.0) == [] and watch.overdue(10.0) == [(0, "h0")]
    # group 0 restarted: its old member id does not count for the new node
    watch.joined(100)
    watch.started(102, 0, "h0", 20.0)
    watch.seen({"corral_1:a", "corral_0:new"}, {0: 102, 1: 101})
    assert 102 not in watch.pending  # a member id first seen now: the new node joined
    watch.started(103, 1, "h1", 30.0)
    watch.seen({"corral_1:a", "corral_0:new"}, {0: 102, 1: 103})
    assert watch.overdue(40.0) == [(1, "h1")]


# -- the pre-flight: torchft on every host -------------------------------------------------


def test_torchft_missing_on_a_host_fails_the_software_check_naming_it() -> None:
    from corral.agent.hostfacts import MODULES
    from corral.checks import software
    from corral.checks.result import Status
    from corral.recovery.inplace import TORCHFT_INSTALL

    from .test_checks import _ctx

    assert "torchft" in MODULES  # the hosts report whether torchft imports
    with_ft = {"software": {"modules": {"torchft": True}}, "packages": {"torchft-nightly": "1"}}
    per_host = {"n1": with_ft, "n2": {"software": {"modules": {"torchft": False}}}, "n3": with_ft}
    result = software.check(_ctx(per_host, torchft=True))
    assert result.status is Status.FAIL
    assert result.hosts["n1"].status is Status.PASS and result.hosts["n3"].status is Status.PASS
    detail = result.hosts["n2"].detail
    assert "torchft cannot be imported by /usr/bin/python3 (--recovery in-place needs it)" in detail
    assert TORCHFT_INSTALL.endswith("pip install torchft-nightly")
    assert result.fix_command is not None
    assert "/usr/bin/python3 -m pip install torchft-nightly  (on n2)" in result.fix_command
    assert result.fix_command.count("torchft") == 1  # not again as a version pin
    # without --recovery in-place torchft is not needed (no installed package differs here)
    no_ft = {"n2": {"software": {"modules": {"torchft": False}}}}
    assert software.check(_ctx(no_ft)).status is Status.PASS
    assert software.check(_ctx(no_ft, torchft=True)).hosts["n2"].status is Status.FAIL


def test_an_in_place_job_asks_its_preflight_for_torchft(monkeypatch: pytest.MonkeyPatch) -> None:
    import types

    import corral.job.preflight as preflight_module

    seen: list[bool] = []

    async def preflight(options: Any, *_: Any) -> None:
        seen.append(options.torchft)

    monkeypatch.setattr(preflight_module, "preflight", preflight)
    for recovery in ("in-place", "restart"):
        spec, made = build_job(JobOptions(command=("t.py",), recovery=recovery))
        transport = FakeTransport({})
        job = new_job(spec, _cluster(3), made, transport=transport)
        asyncio.run(job._checklist(types.SimpleNamespace(spec=spec), transport, None))
    assert seen == [True, False]


# -- calibration weights: one per group, re-split among the live groups by the SDK -----------


def test_calibration_weights_become_one_weight_per_group(monkeypatch: pytest.MonkeyPatch) -> None:
    import types

    from corral.contract import WORKLOAD_WEIGHTS_ENV
    from corral.job import inplace as ip
    from corral.job.engine import dry_run
    from corral.plan.inplace import group_weights
    from corral.sdk._ftsplit import group_weights as sdk_group_weights
    from corral.sdk._ftsplit import quorum_share

    assert group_weights((), (2, 2)) == ()
    assert group_weights((0.1, 0.2, 0.3, 0.4), (2, 2)) == pytest.approx((0.3, 0.7))
    with pytest.raises(ConfigError, match="3 workload weights for the 4 ranks") as info:
        group_weights((0.1, 0.2, 0.3), (2, 2))
    assert info.value.option == "--calibration"

    async def start(*_: Any, **__: Any) -> Any:
        return types.SimpleNamespace(url="http://127.0.0.1:1")

    monkeypatch.setattr(ip.Lighthouse, "start", start)
    monkeypatch.setattr(ip, "reachable_address", lambda peer: "10.0.0.100")  # no route needed
    # 3 hosts of 2 ranks; the third host is twice as fast as the others' ranks
    weights = (0.1, 0.1, 0.1, 0.1, 0.3, 0.3)
    spec = JobSpec(
        script="t.py", job_id="j", python="python3", nproc_per_node=2, workload_weights=weights
    )
    prepared, extra = asyncio.run(ip.setup(dry_run(spec, _cluster(3)), [], None))
    raw = {c.env[WORKLOAD_WEIGHTS_ENV] for c in prepared.commands}
    assert raw == {"0.2,0.2,0.6"}  # every group gets every group's weight
    spare = extra["replan"](2, Host("s", address="10.0.0.9"))
    assert spare.env[WORKLOAD_WEIGHTS_ENV] == "0.2,0.2,0.6"
    # the SDK reads them as per-group weights; when group 0 is gone its share goes to
    # groups 1 and 2 by their weights (1:3), no example dropped
    per_group, _ = sdk_group_weights("0.2,0.2,0.6", 3, 2)
    live = {g: per_group[g] for g in (1, 2)}
    counts = [quorum_share(0, 80, live, g, r, (1.0, 1.0)).count for g in (1, 2) for r in (0, 1)]
    assert counts == [10, 10, 30, 30]
    # without weights, none are passed
    even, _ = asyncio.run(
        ip.setup(dry_run(JobSpec(script="t.py", job_id="j"), _cluster(3)), [], None)
    )
    assert all(WORKLOAD_WEIGHTS_ENV not in c.env for c in even.commands)


# -- corral plan --recovery in-place: the per-group commands ---------------------------------


def test_corral_plan_in_place_prints_each_groups_command() -> None:
    import json

    from typer.testing import CliRunner

    from corral.cli.main import app

    args = ["plan", "--hosts", "h0,h1,h2", "--nproc-per-node", "2", "--python", "python3"]
    args += ["--master-port", "29500"]  # the default, 0, is picked at launch
    tail = ["--", "train.py"]
    runner = CliRunner()
    shown = runner.invoke(app, [*args, "--recovery", "in-place", "--spares", "1", *tail])
    assert shown.exit_code == 0, shown.output
    text = shown.output
    for group, host in enumerate(("h0", "h1")):
        assert f"{REPLICA_GROUP_ENV}={group}" in text
        assert f"--rdzv-endpoint={host}:29500" in text
    assert "--nnodes=1" in text and "--nnodes=2" not in text
    assert f"{REPLICA_GROUPS_ENV}=2" in text and "spare hosts: h2" in text
    raw = runner.invoke(app, [*args, "--recovery", "in-place", "--json", *tail])
    doc = json.loads(raw.output)
    assert [n["env"][REPLICA_GROUP_ENV] for n in doc["nodes"]] == ["0", "1", "2"]
    assert doc["recovery"]["mode"] == "in-place" and doc["recovery"]["spares"] == []
    # the restart plan is unchanged, and what corral run refuses corral plan refuses
    plain = runner.invoke(app, [*args, *tail])
    assert "--nnodes=3" in plain.output and REPLICA_GROUP_ENV not in plain.output
    refused = runner.invoke(app, [*args, "--recovery", "in-place", "--spares", "2", *tail])
    assert isinstance(refused.exception, ConfigError), refused.output
    assert "at least 2 nodes" in str(refused.exception)


# -- where the Lighthouse binds: the address the hosts reach the coordinator by -----------


def test_lighthouse_binds_on_the_route_to_the_hosts_ssh_hostname(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # an ssh config alias (a testbed's tb1) need not resolve here: the route is looked up
    # to the HostName ssh connects to, never silently 127.0.0.1
    import shutil

    from corral.errors import LaunchError
    from corral.job import inplace as ip
    from corral.transport.options import SshOptions
    from tests.conftest import missing_dependency

    if shutil.which("ssh") is None:
        missing_dependency("the OpenSSH client (ssh -G)")
    config = tmp_path / "ssh_config"
    config.write_text("Host alias-0\n  HostName 10.9.8.7\n")
    asked: list[str] = []

    def route(peer: str) -> str | None:
        asked.append(peer)
        return "10.9.8.1" if peer == "10.9.8.7" else None

    monkeypatch.setattr(ip, "reachable_address", route)
    hosts = [Host("alias-0"), Host("h1", address="10.0.0.2")]
    ssh = SshOptions(config=str(config))
    assert asyncio.run(ip.lighthouse_address(hosts, ssh)) == "10.9.8.1"
    assert asked == ["10.9.8.7"]
    # no route: refused with the host named, not a Lighthouse no host can reach
    with pytest.raises(LaunchError, match=r"no address of this machine routes to 10\.0\.0\.2"):
        asyncio.run(ip.lighthouse_address(hosts[1:], ssh))
    local = [Host("local-0", local=True), Host("local-1", local=True)]
    assert asyncio.run(ip.lighthouse_address(local, None)) == "127.0.0.1"


def test_a_rank_stuck_beside_a_hung_group_is_still_watched_after_that_hang() -> None:
    # the watch that replaces a fired one keeps the ranks its verdict did not blame: c,
    # which hangs after the verdict blamed a and never reports again, is named once b
    # moves on (a fresh watch had never seen c report: it named no one, and the job
    # trained on forever without c)
    import time as clock

    from corral.job.inplace import next_watch
    from corral.recovery.hangwatch import HangWatch

    everyone = [("a", 0), ("b", 0), ("c", 0)]
    old = HangWatch(0.05, None)
    for key in everyone:
        old.observe(*key, 5)
    clock.sleep(0.1)
    old.observe("b", 0, 6)
    old.observe("c", 0, 6)
    first = old.check(clock.monotonic(), everyone)
    assert first is not None and first.suspects == [("a", 0)]
    new = next_watch(old, 0.05, None)
    clock.sleep(0.1)
    new.observe("b", 0, 7)  # b trains on; c hung meanwhile, never reports again
    verdict = new.check(clock.monotonic(), [("b", 0), ("c", 0)])
    assert verdict is not None and verdict.suspects == [("c", 0)]


def test_a_suspect_whose_group_was_not_torn_down_is_still_watched() -> None:
    # a verdict named a (a restarting group's rank, or one blamed with it) and c, stuck
    # together; only a's group was torn down: c, still live and never reporting again,
    # is named by the next watch (left out with the suspects, it never was, and the
    # job trained on forever without it)
    import time as clock

    from corral.job.inplace import next_watch
    from corral.recovery.hangwatch import HangWatch

    everyone = [("a", 0), ("b", 0), ("c", 0)]
    old = HangWatch(0.05, None)
    for key in everyone:
        old.observe(*key, 5)
    clock.sleep(0.1)
    old.observe("b", 0, 6)
    first = old.check(clock.monotonic(), everyone)
    assert first is not None and first.suspects == [("a", 0), ("c", 0)]
    new = next_watch(old, 0.05, None, live={("b", 0), ("c", 0)})  # a's group is down
    clock.sleep(0.1)
    new.observe("b", 0, 7)
    verdict = new.check(clock.monotonic(), [("b", 0), ("c", 0)])
    assert verdict is not None and verdict.suspects == [("c", 0)]


def test_a_restarting_group_is_not_judged_on_its_predecessors_progress(tmp_path: Path) -> None:
    # c is SIGKILLed at step 5 and restarted; its new rank takes longer than the hang
    # timeout to report (importing torch, healing) while a and b train on: it is not
    # named as lagging on the step its predecessor reported (which tore its group down
    # again, and again)
    done = asyncio.Event()
    lives = {"c": 0}

    async def survivor(node: FakeNode) -> int:
        _begin(node)
        step = 5
        while not done.is_set():
            node.event("report", rank=0, type="progress", step=step)
            step += 1
            await asyncio.sleep(0.1)
        _end(node, 0)
        return 0

    async def victim(node: FakeNode) -> int:
        lives["c"] += 1
        _begin(node)
        if lives["c"] == 1:
            node.event("report", rank=0, type="progress", step=5)
            _end(node, -9)
            return 0
        await asyncio.sleep(3.5)  # silent for over three hang timeouts
        node.err(0, "healing is required step=0, max_step=7, recover_src_replica_rank=0\n")
        node.event("report", rank=0, type="progress", step=40)
        done.set()
        _end(node, 0)
        return 0

    result, events, _ = asyncio.run(
        _supervise({"a": survivor, "b": survivor, "c": victim}, tmp_path, hang_timeout=1.0)
    )
    assert result.state == JobState.SUCCEEDED
    assert lives["c"] == 2, [e for e in events if isinstance(e, GroupChanged)]
    said = " ".join(str(getattr(e, "text", "")) for e in events)
    assert "hang detect" not in said, said  # no verdict on its predecessor's step
