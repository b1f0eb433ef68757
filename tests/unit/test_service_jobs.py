"""The server's job manager over a real SQLite store, its supervisor start replaced at
the seam (:attr:`corral.service.dispatch.Dispatch.spawn`): dispatch runs the plan the
user confirmed or refuses with the reason; states move only along the one table;
ingest folds typed events."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest
from sqlalchemy import select, update

from corral.errors import Conflict
from corral.job.describe import JobDescription
from corral.service.dispatch import SupervisorProcess
from corral.service.eventlog import EVENTS_FILE
from corral.service.jobs import JobManager
from corral.service.launch import handover, received
from corral.service.machines import MachineService
from corral.service.models import DispatchIn, JobRequest, ResourceRequirements
from corral.service.settings import ServerSettings
from corral.store import Store, open_store
from corral.store.models import Attempt, Event, Job, Machine, Node, Rank
from tests.unit.test_service_planner import machine


class Spawned:
    """The seam: records the job descriptions handed to a supervisor (none started), as
    the supervisor reads them from its stdin."""

    def __init__(self) -> None:
        self.launches: list[JobDescription] = []
        self.stdin: list[bytes] = []

    def __call__(self, launch: JobDescription) -> SupervisorProcess:
        self.stdin.append(handover(launch))
        self.launches.append(received(self.stdin[-1]))
        me = psutil.Process()
        return SupervisorProcess(me.pid, me.create_time())  # "alive": this process


@pytest.fixture
def store(tmp_path: Path) -> Iterator[Store]:
    with open_store(f"sqlite:///{tmp_path / 'corral.db'}") as opened:
        yield opened


def manager(store: Store, tmp_path: Path) -> tuple[JobManager, Spawned]:
    settings = ServerSettings(run_dir=tmp_path / "runs")
    jobs = JobManager(store, settings, MachineService(store, settings))
    spawned = Spawned()
    jobs.dispatcher.spawn = spawned
    return jobs, spawned


def add_machines(store: Store, *machines: Machine) -> None:
    with store.session() as s:
        s.add_all(machines)


def job_request(tmp_path: Path, num: int = 2, **extra: object) -> JobRequest:
    script = tmp_path / "train.py"
    script.write_text("print('hi')\n")
    return JobRequest(
        script=str(script),
        launcher="python",
        preflight=False,
        resource_requirements=ResourceRequirements(num_machines=num),
        **extra,  # type: ignore[arg-type]
    )


@pytest.fixture
def planned(store: Store, tmp_path: Path) -> tuple[JobManager, Spawned, str]:
    add_machines(store, machine("a", local=True), machine("b", local=True))
    jobs, spawned = manager(store, tmp_path)
    return jobs, spawned, jobs.plan(job_request(tmp_path)).job_id


def stored(store: Store, job_id: str) -> JobDescription:
    with store.session() as s:
        row = s.get_one(Job, job_id)
        assert row.launch is not None
        return JobDescription.from_dict(row.launch)


# -- the plan that runs --------------------------------------------------------------------


def test_dispatch_hands_the_supervisor_exactly_the_stored_request(
    planned: tuple[JobManager, Spawned, str], store: Store
) -> None:
    jobs, spawned, job_id = planned
    status = jobs.dispatch(DispatchIn(job_id=job_id))
    assert spawned.launches == [stored(store, job_id)]
    assert [h.name for h in spawned.launches[0].cluster.hosts] == ["a", "b"]
    assert status.status == "pending"


def test_a_server_restarted_after_planning_runs_the_stored_request(
    planned: tuple[JobManager, Spawned, str], store: Store, tmp_path: Path
) -> None:
    _, _, job_id = planned
    # a better machine registered since: a new plan would choose it, the stored one not
    add_machines(store, machine("c", local=True, slots=8))
    again, spawned = manager(store, tmp_path)  # nothing in memory
    again.dispatch(DispatchIn(job_id=job_id))
    assert spawned.launches == [stored(store, job_id)]
    assert [h.name for h in spawned.launches[0].cluster.hosts] == ["a", "b"]


@pytest.mark.parametrize(
    ("change", "reason"),
    [
        ({"address": "10.0.0.9", "local": False}, "machine b changed (address '' -> '10.0.0.9'"),
        ({"slots": 4}, "machine b changed (slots 2 -> 4)"),
        ({"python": "/opt/py/bin/python"}, "machine b changed (python None -> '/opt/py"),
    ],
)
def test_dispatch_after_a_machine_was_edited_is_refused_with_the_reason(
    planned: tuple[JobManager, Spawned, str], store: Store, change: dict[str, object], reason: str
) -> None:
    jobs, spawned, job_id = planned
    with store.session() as s:
        s.execute(update(Machine).where(Machine.name == "b").values(**change))
    with pytest.raises(Conflict, match="machines changed since it was planned") as caught:
        jobs.dispatch(DispatchIn(job_id=job_id))
    assert reason in str(caught.value)
    assert spawned.launches == []
    assert jobs.row(job_id).state == "planned"


def test_dispatch_after_a_machine_was_removed_is_refused_with_the_reason(
    planned: tuple[JobManager, Spawned, str],
) -> None:
    jobs, spawned, job_id = planned
    jobs.machines.delete("m-a")
    with pytest.raises(Conflict, match="machine a was removed") as caught:
        jobs.dispatch(DispatchIn(job_id=job_id))
    assert caught.value.info["changed"] == ["machine a was removed"]
    assert spawned.launches == []


def test_dispatch_while_a_machine_is_busy_is_refused(
    planned: tuple[JobManager, Spawned, str], tmp_path: Path
) -> None:
    jobs, spawned, job_id = planned
    other = jobs.plan(job_request(tmp_path)).job_id
    jobs.dispatch(DispatchIn(job_id=other))
    with pytest.raises(Conflict, match="machines are busy: a with"):
        jobs.dispatch(DispatchIn(job_id=job_id))
    assert len(spawned.launches) == 1


def test_a_plan_with_secrets_is_not_run_after_a_restart(store: Store, tmp_path: Path) -> None:
    add_machines(store, machine("a", local=True))
    jobs, _ = manager(store, tmp_path)
    job_id = jobs.plan(job_request(tmp_path, num=1, env={"HF_TOKEN": "hf_xyz"})).job_id
    with store.session() as s:
        assert "hf_xyz" not in json.dumps(s.get_one(Job, job_id).launch)
    again, spawned = manager(store, tmp_path)
    with pytest.raises(Conflict, match="secret env values"):
        again.dispatch(DispatchIn(job_id=job_id))
    assert spawned.launches == []


def test_the_supervisor_stdin_holds_the_stored_description_and_the_secrets_beside_it(
    store: Store, tmp_path: Path
) -> None:
    add_machines(store, machine("a", local=True))
    jobs, spawned = manager(store, tmp_path)
    job_id = jobs.plan(job_request(tmp_path, num=1, env={"HF_TOKEN": "hf_xyz", "A": "1"})).job_id
    jobs.dispatch(DispatchIn(job_id=job_id))
    with store.session() as s:
        row = s.get_one(Job, job_id)
    sent = json.loads(spawned.stdin[0])
    assert sent["description"] == row.launch  # the stored JSON, exactly
    assert sent["secrets"] == {"HF_TOKEN": "hf_xyz"}
    assert spawned.launches[0].options.env["HF_TOKEN"] == "hf_xyz"
    assert spawned.launches[0].options.env["A"] == "1"


def test_a_plan_stored_by_an_older_server_runs_converted(
    planned: tuple[JobManager, Spawned, str], store: Store, tmp_path: Path
) -> None:
    from tests.unit.test_job_describe import old_launch_request

    _, _, job_id = planned
    with store.session() as s:
        row = s.get_one(Job, job_id)
        hosts = [
            {**old_launch_request()["hosts"][0], "name": h.name, "slots": h.slots, "labels": {}}
            for h in JobDescription.from_dict(row.launch).cluster.hosts
        ]
        row.launch = old_launch_request(job_id=job_id, hosts=hosts)
    again, spawned = manager(store, tmp_path)
    again.dispatch(DispatchIn(job_id=job_id))
    assert [h.name for h in spawned.launches[0].cluster.hosts] == ["a", "b"]
    assert spawned.launches[0].options.command == ("/srv/train.py", "--steps", "3")


def test_a_stored_plan_that_cannot_be_read_is_refused_with_the_reason(
    planned: tuple[JobManager, Spawned, str], store: Store, tmp_path: Path
) -> None:
    _, _, job_id = planned
    with store.session() as s:
        row = s.get_one(Job, job_id)
        row.launch = {**(row.launch or {}), "version": 7}
    again, spawned = manager(store, tmp_path)
    with pytest.raises(Conflict, match="stored plan cannot be run: job description: version 7"):
        again.dispatch(DispatchIn(job_id=job_id))
    assert spawned.launches == []
    assert again.row(job_id).state == "planned"


# -- states along the table ----------------------------------------------------------------


def test_a_state_write_outside_the_table_does_nothing(
    planned: tuple[JobManager, Spawned, str],
) -> None:
    jobs, _, job_id = planned
    jobs.stop(job_id)
    assert jobs.row(job_id).state == "cancelled"
    jobs._set(job_id, state="failed", reason="cannot run: late")  # the scheduler, too late
    assert (jobs.row(job_id).state, jobs.row(job_id).reason) == (
        "cancelled",
        "stopped by the API before it started",
    )
    with pytest.raises(Conflict, match="only a planned job"):
        jobs.dispatch(DispatchIn(job_id=job_id))


def test_a_queued_job_is_planned_and_put_back(
    planned: tuple[JobManager, Spawned, str],
) -> None:
    jobs, _, job_id = planned
    jobs._set(job_id, state="queued", reason="waiting: busy")
    assert jobs.row(job_id).state == "queued"
    jobs._set(job_id, state="running")  # not from queued
    assert jobs.row(job_id).state == "queued"


# -- ingest --------------------------------------------------------------------------------


def write_events(path: Path, *events: dict[str, object]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a") as fh:
        for event in events:
            fh.write(json.dumps(event) + "\n")


def test_ingest_folds_typed_events_and_keeps_what_it_cannot_read(
    planned: tuple[JobManager, Spawned, str], store: Store
) -> None:
    jobs, _, job_id = planned
    jobs.dispatch(DispatchIn(job_id=job_id))
    events = Path(jobs.row(job_id).run_dir) / EVENTS_FILE
    now = time.time()
    write_events(
        events,
        {"kind": "state", "time": now, "old": "pending", "state": "preparing", "attempt": 0},
        {"kind": "attempt_started", "time": now, "number": 0, "hosts": ["a", "b"], "world_size": 4},
        {"kind": "state", "time": now, "old": "preparing", "state": "starting", "attempt": 0},
        {"kind": "node", "time": now, "state": "running"},  # no host: not understood
        {"kind": "from_a_newer_corral", "time": now, "x": 1},
        {"kind": "node", "time": now, "host": "a", "state": "running", "detail": "2 ranks"},
        {"kind": "progress", "time": now, "host": "a", "rank": 0, "step": 5, "total": 10},
        {"kind": "log", "time": now, "host": "a", "rank": 0, "text": "hello\n"},
        {"kind": "state", "time": now, "old": "starting", "state": "running", "attempt": 0},
    )
    assert jobs.ingest_once() == []
    with store.session() as s:
        job = s.get_one(Job, job_id)
        assert (job.state, job.world_size, job.last_metrics["step"]) == ("running", 4, 5)
        nodes = {n.host: (n.state, n.detail) for n in s.scalars(select(Node))}
        assert nodes == {"a": ("running", "2 ranks"), "b": ("starting", "")}
        assert s.get_one(Rank, (job_id, 0)).total == 10
        assert s.get_one(Attempt, (job_id, 0)).hosts == ["a", "b"]
        kinds = [e.kind for e in s.scalars(select(Event).order_by(Event.pos))]
    assert kinds == [
        "state", "attempt_started", "state", "node", "from_a_newer_corral", "node",
        "progress", "state",
    ]  # fmt: skip
    write_events(
        events,
        {"kind": "state", "time": now, "old": "running", "state": "succeeded", "attempt": 0},
        {"kind": "finished", "time": now, "state": "succeeded", "exit_code": 0,
         "result": {"ended": now + 1, "failures": []}},
    )  # fmt: skip
    assert jobs.ingest_once() == [job_id]
    row = jobs.row(job_id)
    assert (row.state, row.exit_code, row.ended) == ("succeeded", 0, now + 1)


def test_a_job_whose_supervisor_is_gone_is_lost(
    planned: tuple[JobManager, Spawned, str], store: Store
) -> None:
    jobs, _, job_id = planned
    jobs.dispatch(DispatchIn(job_id=job_id))
    with store.session() as s:  # a supervisor that ended: no process has this start time
        s.execute(update(Job).where(Job.id == job_id).values(supervisor_started=1.0))
    assert jobs.reattach() == {job_id: "lost"}
    row = jobs.row(job_id)
    assert row.state == "lost" and "ended without reporting a result" in row.reason
    last = (Path(row.run_dir) / EVENTS_FILE).read_text().splitlines()[-1]
    assert json.loads(last)["kind"] == "lost"
