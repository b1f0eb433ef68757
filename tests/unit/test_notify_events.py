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
from corral.notify.events import HANG_PREFIX
from corral.store import open_store
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
