"""Request ids on an actor channel: a worker's messages name the request they answer,
so a ``call`` takes only answers to its own message and an answer to a failed call
never reaches a later ``recv``."""

from __future__ import annotations

import io
import os
import threading
from typing import Any, cast

import pytest

from corral.actors import _cluster
from corral.actors import _framing as fr
from corral.actors._channel import Mailbox
from corral.actors._cluster import WorkerHandle, _gather
from corral.actors.errors import ActorGroupError, ActorTimeout, WorkerDied
from corral.actors.worker import CoordinatorHandle


def msg(answers: int, value: object) -> bytes:
    """A MSG body from a worker answering request ``answers``."""
    return fr.msg_head(answers) + fr.dumps(value)


class Handle:
    """What ``_gather`` reads of a WorkerHandle: host, rank and the mailbox."""

    def __init__(self, rank: int, cond: threading.Condition) -> None:
        self.host = f"h{rank}"
        self.rank = rank
        self._mailbox = Mailbox(cond)


def handles(n: int) -> list[Handle]:
    cond = threading.Condition()
    return [Handle(rank, cond) for rank in range(n)]


def gather(group: list[Handle], timeout: float | None, requests: dict[int, int]) -> list[Any]:
    return _gather(cast("list[WorkerHandle]", group), timeout, "call", requests)


def values(box: Mailbox) -> list[object]:
    return [fr.msg_value(value[1]) for kind, value in box.items if kind == "msg"]


def test_a_message_body_carries_its_id_without_joining_a_large_payload() -> None:
    big = os.urandom(1 << 17)
    read_fd, write_fd = os.pipe()
    writer = threading.Thread(
        target=lambda: fr.write_frame(write_fd, fr.MSG, fr.dumps(big), head=fr.msg_head(42))
    )
    writer.start()
    with io.FileIO(read_fd, "rb", closefd=True) as reader:
        got = fr.read_frame(reader)
        writer.join()
        os.close(write_fd)
    assert got is not None and got[0] == fr.MSG
    assert fr.msg_id(got[1]) == 42 and fr.msg_value(got[1]) == big
    with pytest.raises(fr.ProtocolError):
        fr.msg_id(b"1234")


def test_the_worker_answers_the_last_message_its_work_fn_received() -> None:
    read_fd, write_fd = os.pipe()
    info = {"host": "h", "rank": 0, "local_rank": 0, "world_size": 1}
    handle = CoordinatorHandle(write_fd, {**info, "local_world_size": 1, "node_rank": 0})
    with io.FileIO(read_fd, "rb", closefd=True) as reader:
        handle.send("before anything")
        handle._deliver(bytearray(fr.msg_head(7) + fr.dumps("seven")))
        handle._deliver(bytearray(fr.msg_head(8) + fr.dumps("eight")))
        assert handle.recv(timeout=1) == "seven"
        handle.send("answer")
        assert handle.recv(timeout=1) == "eight"
        handle.send("another")
        os.close(write_fd)
        frames = []
        while (frame := fr.read_frame(reader)) is not None:
            frames.append((fr.msg_id(frame[1]), fr.msg_value(frame[1])))
    assert frames == [(0, "before anything"), (7, "answer"), (8, "another")]


def test_an_abandoned_request_is_dropped_now_and_when_it_comes() -> None:
    box = Mailbox(threading.Condition())
    box.put_msg(msg(3, "old"))
    box.put_msg(msg(5, "late part 1"))
    with box.cond:
        box.abandon(5)
    box.put_msg(msg(5, "late part 2"))
    box.put_msg(msg(6, "fresh"))
    assert values(box) == ["old", "fresh"]
    assert box.abandoned == set()  # the worker answers 6 now: 5 never comes again
    box.abandon(9)
    box.renew()  # a restarted worker: its answers are all new
    box.put_msg(msg(9, "new process"))
    assert values(box)[-1] == "new process"


def test_a_call_takes_only_the_answer_to_its_own_message() -> None:
    (one,) = handles(1)
    one._mailbox.put_msg(msg(1, "unread answer to an earlier send"))
    one._mailbox.put_msg(msg(2, "the call's answer"))
    assert gather([one], 5, {0: 2}) == ["the call's answer"]
    assert values(one._mailbox) == ["unread answer to an earlier send"]  # left for recv


def test_a_failed_call_leaves_no_late_answer_and_names_the_failure_first(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(_cluster, "GROUP_GRACE", 0.05)
    group = handles(4)
    group[3]._mailbox.put_msg(msg(1, "fast"))
    died = WorkerDied("killed by SIGKILL", host="h1", rank=1, signal_name="SIGKILL")
    group[1]._mailbox.finish(died)
    with pytest.raises(ActorGroupError) as info:
        gather(group, 60, {0: 1, 1: 1, 2: 1, 3: 1})
    error = info.value
    assert (error.host, error.rank) == ("h1", 1)
    assert str(error).splitlines()[0] == "[h1:1] call failed on 3 worker(s): [h1:1], [h0:0], [h2:2]"
    assert error.results == {3: "fast"}
    timeout = error.errors[0]
    assert isinstance(timeout, ActorTimeout)
    assert timeout.timeout == 60 and timeout.waited < 60
    assert "within 60" not in str(error)
    assert "gave up 0.05 s after [h1:1] failed; timeout=60 s" in str(error)
    for late in (0, 2):  # the answers the call gave up on come now: nobody gets them
        group[late]._mailbox.put_msg(msg(1, "late"))
        group[late]._mailbox.put_msg(msg(2, "answer to the next message"))
        assert values(group[late]._mailbox) == ["answer to the next message"]


def test_a_timeout_of_the_whole_call_says_so() -> None:
    group = handles(2)
    group[0]._mailbox.put_msg(msg(4, "on time"))
    with pytest.raises(ActorGroupError) as info:
        gather(group, 0.05, {0: 4, 1: 4})
    (error,) = info.value.errors.values()
    assert isinstance(error, ActorTimeout) and error.note == "" and error.waited >= 0.05
    assert error.message == f"no message within {error.waited:.1f} s"
    group[1]._mailbox.put_msg(msg(4, "late"))
    assert values(group[1]._mailbox) == []
