"""corral's Lighthouse (torchft's, as ``--recovery in-place`` starts it) issues the
survivors' quorum soon after a replica group is lost: the heartbeat timeout it is
started with decides how long the survivors wait (bench_inplace.py's "fault ->
survivors' next step"); and it keeps a live group that asks a step's time after the
others in their quorum: its join timeout exceeds a step. Real Lighthouse child,
torchft's own client; each survivor asks with a quorum timeout the old settings
(heartbeat 5 s) could not meet, so without the shorter one its quorum call fails
instead of going on."""

from __future__ import annotations

import asyncio
import contextlib
import sys
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta
from typing import Any

import pytest

from corral.defaults import DEFAULT_FT_JOIN_TIMEOUT
from corral.recovery.lighthouse import HEARTBEAT_TIMEOUT_MS, Lighthouse
from tests.conftest import require

pytestmark = pytest.mark.torch


@contextlib.contextmanager
def _child(
    monkeypatch: pytest.MonkeyPatch, **options: Any
) -> Iterator[tuple[Lighthouse, asyncio.AbstractEventLoop]]:
    """A Lighthouse child as the coordinator starts it (min_replicas 1; ``options``:
    :meth:`Lighthouse.start`'s), and the loop it runs under."""
    monkeypatch.setenv("RUST_LOG", "warn")
    require("torchft", "install the [ft] extra: make setup")
    loop = asyncio.new_event_loop()
    child = loop.run_until_complete(Lighthouse.start(sys.executable, "127.0.0.1", 1, **options))
    try:
        yield child, loop
    finally:
        loop.run_until_complete(child.close())
        loop.close()


@pytest.fixture
def lighthouse(monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """A Lighthouse child as the coordinator starts it; its URL."""
    with _child(monkeypatch) as (child, _):
        yield child.url


def _survivors_quorum(
    url: str, lost: list[str], survivors: list[str], timeout: float, late: float = 0.0
) -> Any:
    """The lost groups heartbeat once (their last sign of life), then each survivor
    asks for a quorum (a thread each; the last one ``late`` s after the others) while
    heartbeating every 100 ms, as torchft's Manager does; the members of the quorum
    each got."""
    import time

    from torchft.coordination import LighthouseClient

    def client() -> Any:
        return LighthouseClient(url, connect_timeout=timedelta(seconds=30))

    for replica in lost + survivors:  # the survivors' Managers heartbeat from their start
        client().heartbeat(replica)
    done = threading.Event()

    def heartbeat(replica: str) -> None:
        beat = client()
        while not done.wait(0.1):
            beat.heartbeat(replica)

    def ask(replica: str) -> list[str] | None:
        if replica == survivors[-1]:
            time.sleep(late)
        try:
            quorum = client().quorum(
                replica_id=replica,
                timeout=timedelta(seconds=timeout),
                address=f"addr-{replica}",
                store_address=f"store-{replica}",
                step=1,
                world_size=1,
            )
        except Exception:  # torchft's client raises its own errors: None, no quorum
            return None
        return sorted(p.replica_id for p in quorum.participants)

    beats = [threading.Thread(target=heartbeat, args=(r,), daemon=True) for r in survivors]
    for thread in beats:
        thread.start()
    try:
        with ThreadPoolExecutor(len(survivors)) as pool:
            return list(pool.map(ask, survivors))
    finally:
        done.set()
        for thread in beats:
            thread.join(10)


def test_the_survivor_of_two_goes_on_once_the_lost_groups_heartbeat_is_stale(
    lighthouse: str,
) -> None:
    # one survivor of two is never more than half of the heartbeating groups, so its
    # quorum waits until the lost group's heartbeat times out (the join timeout
    # cannot issue it); a quorum timeout of 4 s: more than the heartbeat timeout
    # with room for a busy machine, less than the 5 s it was
    assert HEARTBEAT_TIMEOUT_MS <= 1000
    assert _survivors_quorum(lighthouse, ["b"], ["a"], 4.0) == [["a"]]


def test_two_survivors_of_three_go_on_once_the_lost_groups_heartbeat_is_stale(
    lighthouse: str,
) -> None:
    # the join timeout waits for heartbeating groups only: a dead group's stale
    # heartbeat ends the survivors' wait however long the join timeout is; a quorum
    # timeout of 2.5 s: above the heartbeat timeout with room for a busy machine
    assert HEARTBEAT_TIMEOUT_MS <= 1000 and DEFAULT_FT_JOIN_TIMEOUT > 2.5
    assert _survivors_quorum(lighthouse, ["c"], ["a", "b"], 2.5) == [["a", "b"]] * 2


def test_a_live_group_a_step_behind_is_in_the_others_quorum(lighthouse: str) -> None:
    # three heartbeating groups, the third asking 2 s after the others (a step of 2 s
    # behind, say after a heal): all three train that step together. With a join
    # timeout shorter than a step (500 ms until 2026-11-29) the first two went on
    # alone, the third got a quorum of its own a step later, and so on at every step:
    # the groups never trained together again, each healing from the other
    quorums = _survivors_quorum(lighthouse, [], ["a", "b", "c"], DEFAULT_FT_JOIN_TIMEOUT + 5, 2.0)
    assert quorums == [["a", "b", "c"]] * 3


def test_the_jobs_join_timeout_is_the_lighthouses_after_a_restart_too(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # --ft-join-timeout 0.5: the same late group (2 s) is left out of the others'
    # quorum, in the Lighthouse corral restarted (the job's value, not the default);
    # alone it is never a majority of the three heartbeating groups: no quorum
    with _child(monkeypatch, join_timeout=0.5) as (child, loop):
        child.proc.kill()
        loop.run_until_complete(child.restart())
        with open(f"/proc/{child.proc.pid}/cmdline", "rb") as cmdline:
            argv = cmdline.read().decode().split("\0")
        assert argv[argv.index("--join-timeout-ms") + 1] == "500"
        quorums = _survivors_quorum(child.url, [], ["a", "b", "c"], 4.0, 2.0)
        assert quorums == [["a", "b"], ["a", "b"], None]
