"""What each typed job event means to the people watching (pure), the signature, and
the pending deliveries surviving a server restart (a real SQLite store)."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest

from corral.job.events import (
    AttemptStarted,
    Finished,
    GroupChanged,
    JobEvent,
    LaunchFailed,
    Lost,
    Message,
    NodeChanged,
    Progress,
    StateChanged,
)
from corral.job.states import JobState, NodeState
from corral.notify import EVENTS, DeliveryPolicy, JobFacts, Notifications, notices, sign, verify
from corral.notify.events import HANG_PREFIX, duration, for_target
from corral.store import Store, open_store
from corral.store.models import Delivery, Job, Webhook

JOB = JobFacts(id="j1", state="running")
CAUSE = {"host": "gpu2", "rank": 3, "message": "exit code 1", "log_tail": ["Traceback"]}


def names(event: JobEvent, job: JobFacts = JOB) -> list[str]:
    return [n.event for n in notices(event, job)]


def test_the_first_attempt_running_is_started_and_a_queued_job_says_so_too() -> None:
    running = StateChanged(job_id="j1", old=JobState.STARTING, state=JobState.RUNNING, time=100)
    assert names(running) == ["started"]
    queued = JobFacts(id="j1", state="running", queued=40.0)
    found = notices(running, queued)
    assert [n.event for n in found] == ["started", "queued_started"]
    assert found[1].text == "job j1 started after 60 s in the queue"
    again = StateChanged(job_id="j1", old=JobState.STARTING, state=JobState.RUNNING, attempt=1)
    assert names(again) == []


def test_restarts_hosts_lost_healing_and_hangs() -> None:
    restart = AttemptStarted(job_id="j1", number=2, hosts=["a", "b"], world_size=2, checkpoint="c")
    assert notices(restart, JOB)[0].text == "job j1 restarted: attempt 2 on 2 hosts from c"
    assert names(AttemptStarted(job_id="j1", number=0, hosts=["a"], world_size=1)) == []
    lost = NodeChanged(job_id="j1", host="b", state=NodeState.LOST, detail="no heartbeat")
    assert notices(lost, JOB)[0].text == "job j1 lost host b: no heartbeat"
    assert names(NodeChanged(job_id="j1", host="b", state=NodeState.FAILED)) == []
    group = {"job_id": "j1", "host": "b", "group": 1, "participants": 1}
    assert names(GroupChanged(change="lost", **group)) == ["host_lost"]
    killed = GroupChanged(change="lost", detail="rank 1 on b killed by SIGKILL", **group)
    found = notices(killed, JOB)[0]
    assert found.text == "job j1 lost replica group 1 on b: rank 1 on b killed by SIGKILL"
    assert found.data["lost"] == "group" and found.data["detail"].endswith("SIGKILL")
    assert notices(lost, JOB)[0].data["lost"] == "host"
    healed = GroupChanged(change="rejoined", step=40, healed_from="a", **group)
    assert (
        notices(healed, JOB)[0].text == "job j1 healed: b trains again at step 40 (healed from a)"
    )
    hang = Message(job_id="j1", text=HANG_PREFIX + "no progress for 60 s", level="error")
    assert names(hang) == ["hang"]
    assert names(Message(job_id="j1", text="hang detected: x", level="info")) == []
    assert names(Progress(job_id="j1", host="a", rank=0, step=3)) == []


@pytest.mark.parametrize(
    ("event", "expected"),
    [
        (Finished(job_id="j1", state=JobState.SUCCEEDED, exit_code=0, result={}), ["finished"]),
        (Finished(job_id="j1", state=JobState.CANCELLED, exit_code=130, result={}), ["finished"]),
        (
            Finished(job_id="j1", state=JobState.FAILED, exit_code=1, result={}),
            ["finished", "failed"],
        ),
        (
            Finished(job_id="j1", state=JobState.TIMED_OUT, exit_code=124, result={}),
            ["finished", "failed"],
        ),
        (LaunchFailed(job_id="j1", message="pre-flight failed"), ["finished", "failed"]),
        (Lost(job_id="j1", reason="supervisor gone"), ["finished", "failed"]),
    ],
)
def test_every_end_is_finished_and_an_unsuccessful_one_failed_with_its_root_cause(
    event: JobEvent, expected: list[str]
) -> None:
    job = JobFacts(id="j1", state="failed", reason="failure", exit_code=1, root_cause=CAUSE)
    found = notices(event, job)
    assert [n.event for n in found] == expected
    if "failed" in expected:
        failed = found[1]
        assert failed.text.endswith("rank 3 on gpu2: exit code 1")
        assert "log_tail" not in failed.data["root_cause"]  # the output stays on the server
    assert set(expected) <= set(EVENTS)


@pytest.mark.parametrize(
    ("state", "wanted", "expected"),
    [
        ("failed", EVENTS, ["failed"]),
        ("failed", ["finished"], ["finished"]),
        ("failed", ["failed"], ["failed"]),
        ("failed", ["started"], []),
        ("succeeded", EVENTS, ["finished"]),
        ("succeeded", ["failed"], []),
    ],
)
def test_a_target_gets_exactly_one_terminal_event(
    state: str, wanted: list[str], expected: list[str]
) -> None:
    end = Finished(job_id="j1", state=JobState(state), exit_code=int(state == "failed"), result={})
    job = JobFacts(id="j1", state=state, reason="failure", exit_code=1, root_cause=CAUSE)
    got = for_target(notices(end, job), wanted)
    assert [n.event for n in got] == expected
    if expected == ["failed"]:  # it carries what finished would have
        assert got[0].data["state"] == "failed" and got[0].data["exit_code"] == 1


def test_texts_name_the_job_and_the_time_queued_is_not_rounded_away() -> None:
    named = JobFacts(id="j1", state="running", name="resnet-a", queued=100.0)
    running = StateChanged(job_id="j1", old=JobState.STARTING, state=JobState.RUNNING, time=250)
    found = notices(running, named)
    assert found[0].text == "job resnet-a (j1) started"
    assert found[1].text == "job resnet-a (j1) started after 2 min 30 s in the queue"
    assert [duration(s) for s in (0.4, 45, 119.6, 150, 180, 3599, 3600, 3900)] == [
        "0 s", "45 s", "2 min", "2 min 30 s", "3 min", "59 min 59 s", "1 h", "1 h 5 min",
    ]  # fmt: skip


def test_a_jobs_notices_reach_a_target_in_order(tmp_path: Path) -> None:
    """A later notice of a job waits while an earlier one to the same target is
    pending; another job's and another target's do not wait."""
    with open_store(f"sqlite:///{tmp_path / 'corral.db'}") as store:
        with store.session() as s:
            for hook in ("h1", "h2"):
                s.add(Webhook(id=hook, kind="webhook", url="http://127.0.0.1:9/",
                              events=list(EVENTS), secret="k" * 16, created=1.0))  # fmt: skip
            jobs = [Job(id=j, state="running", created=1.0) for j in ("j1", "j2")]
            s.add_all(jobs)
            s.flush()
            sender = Notifications(store)
            for job in jobs:
                start = StateChanged(job_id=job.id, old=JobState.STARTING, state=JobState.RUNNING)
                sender.record(s, job, start)
            end = Finished(job_id="j1", state=JobState.SUCCEEDED, exit_code=0, result={})
            sender.record(s, jobs[0], end)
        due, _ = sender._claim()
        assert claimed(store, due) == [
            ("h1", "j1", "started"), ("h1", "j2", "started"),
            ("h2", "j1", "started"), ("h2", "j2", "started"),
        ]  # fmt: skip
        with store.session() as s:  # delivered: the next one of j1 is due
            for d in due:
                s.get_one(Delivery, d).state = "delivered"
        sender._inflight.clear()
        again, _ = sender._claim()
        assert claimed(store, again) == [("h1", "j1", "finished"), ("h2", "j1", "finished")]


def claimed(store: Store, ids: list[int]) -> list[tuple[str, str | None, str]]:
    with store.session() as s:
        rows = [s.get_one(Delivery, i) for i in ids]
        return sorted((d.hook_id, d.job_id, d.event) for d in rows)


def test_the_signature_is_the_hmac_of_the_raw_body() -> None:
    body = b'{"event":"started"}'
    header = sign("s3cret-key", body)
    assert header.startswith("sha256=") and len(header) == 7 + 64
    assert verify("s3cret-key", body, header)
    assert not verify("s3cret-key", body + b" ", header)
    assert not verify("other-key", body, header)
    assert not verify("s3cret-key", body, None)


def test_the_backoff_doubles_up_to_its_cap() -> None:
    policy = DeliveryPolicy(backoff=2.0, max_backoff=10.0)
    assert [policy.delay(n) for n in (1, 2, 3, 4, 5)] == [2.0, 4.0, 8.0, 10.0, 10.0]


def test_pending_deliveries_survive_a_restart_and_a_target_gone_drops_them(
    tmp_path: Path,
) -> None:
    """Recorded in the ingest's transaction, sent by the next server's worker."""
    with open_store(f"sqlite:///{tmp_path / 'corral.db'}") as store:
        with store.session() as s:
            s.add(Webhook(id="h1", kind="webhook", url="http://127.0.0.1:9/", events=["started"],
                          secret="k" * 16, created=1.0))  # fmt: skip
            job = Job(id="j1", state="running", created=1.0)
            s.add(job)
            s.flush()
            first = Notifications(store)  # this "server" stops before sending
            event = StateChanged(job_id="j1", old=JobState.STARTING, state=JobState.RUNNING)
            first.record(s, job, event)
        again = Notifications(store, DeliveryPolicy(backoff=0.01, attempts=2, timeout=5))

        async def one_round() -> None:
            worker = asyncio.create_task(again.run(idle=0.05))
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline:
                with store.session() as s:
                    if s.get_one(Delivery, 1).state != "pending":
                        break
                await asyncio.sleep(0.05)
            worker.cancel()

        asyncio.run(one_round())
        with store.session() as s:
            sent = s.get_one(Delivery, 1)
            assert (sent.state, sent.attempts, sent.event) == ("failed", 2, "started")
            assert sent.last_error and "ConnectError" in sent.last_error
        again.delete("webhook", "h1")
        with store.session() as s:
            assert s.get(Delivery, 1) is None
