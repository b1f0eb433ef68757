"""--track: targets and their validation, the forwarding thread, and the job events
turned into tracker records (a recording tracker at the seam)."""

from __future__ import annotations

import sys
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any, cast

import pytest
from pydantic import ValidationError

from corral.cluster.model import Cluster, Host
from corral.errors import ConfigError
from corral.job.build import build_job
from corral.job.describe import JobOptions
from corral.job.engine import Job
from corral.job.events import AttemptStarted, Finished, JobEvent, Message, Progress
from corral.job.result import Failure, JobResult
from corral.job.states import JobState
from corral.job.tracking import TrackingSubscriber
from corral.plan.spec import JobSpec
from corral.service.models import JobRequest
from corral.track.base import FinalState, Point, RunInfo
from corral.track.forward import Forwarder
from corral.track.targets import TrackPolicy, TrackTarget, parse_target, parse_targets
from tests.conftest import require


class Recorder:
    """A tracker that records every call (optionally failing at one of them)."""

    def __init__(self, target: TrackTarget, fail: str = "", gate: threading.Event | None = None):
        self.target = target
        self.fail = fail
        self.gate = gate
        self.run: RunInfo | None = None
        self.points: list[Point] = []
        self.calls: list[int] = []  # the size of every log() batch
        self.final: FinalState | None = None

    def start(self, run: RunInfo) -> None:
        if self.fail == "start":
            raise RuntimeError("connection refused")
        self.run = run

    def log(self, points: Sequence[Point]) -> None:
        if self.gate is not None:
            self.gate.wait(10)
        if self.fail == "log":
            raise RuntimeError("tracking server said 500\nwith details")
        self.calls.append(len(points))
        self.points.extend(points)

    def finish(self, final: FinalState) -> None:
        self.final = final


TB = TrackTarget("tensorboard", "tb")
ML = TrackTarget("mlflow", "sqlite:///m.db")


def _forwarder(*trackers: Recorder, queue_size: int = 10_000) -> Forwarder:
    by_target = {t.target: t for t in trackers}
    return Forwarder(list(by_target), opener=lambda t: by_target[t], queue_size=queue_size)


# -- targets -----------------------------------------------------------------------------


def test_targets_parse() -> None:
    assert parse_target("mlflow:sqlite:///x.db") == TrackTarget("mlflow", "sqlite:///x.db")
    assert parse_target("tensorboard:runs/tb").where == "runs/tb"
    assert parse_target("wandb:team/proj") == TrackTarget("wandb", "team/proj")


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("comet:proj", "BACKEND:WHERE"),
        ("tensorboard", "BACKEND:WHERE"),
        ("mlflow:", "needs a location"),
        ("mlflow:http://me:secret@host:5000", "no password"),
        ("wandb:a/b/c", "not PROJECT or ENTITY/PROJECT"),
    ],
)
def test_a_bad_target_names_the_option(text: str, says: str) -> None:
    with pytest.raises(ConfigError, match=says) as err:
        parse_target(text)
    assert err.value.option == "--track"


def test_a_target_given_twice_is_refused() -> None:
    with pytest.raises(ConfigError, match="given twice"):
        parse_targets(["tensorboard:tb", "tensorboard:tb"])


@pytest.mark.parametrize(
    ("target", "module"),
    [("mlflow:sqlite:///m.db", "mlflow"), ("tensorboard:tb", "tensorboard"), ("wandb:p", "wandb")],
)
def test_a_missing_extra_is_an_error_before_launch(
    target: str, module: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, module, None)  # as if not installed
    with pytest.raises(ConfigError) as err:
        build_job(JobOptions(command=("train.py",), track=(target,)))
    assert err.value.option == "--track"
    assert f"pip install 'corral[{module}]'" in str(err.value)


def test_the_job_options_carry_the_targets() -> None:
    _, made = build_job(JobOptions(command=("train.py",), track=("tensorboard:tb",)))
    assert made.tracking.targets == (TrackTarget("tensorboard", "tb"),)


def test_the_api_request_accepts_and_validates_track(monkeypatch: pytest.MonkeyPatch) -> None:
    ok = JobRequest(script="train.py", track=["tensorboard:tb", "wandb:proj"])
    assert ok.track == ["tensorboard:tb", "wandb:proj"]
    assert JobRequest(script="train.py").track == []
    with pytest.raises(ValidationError, match="BACKEND:WHERE"):
        JobRequest(script="train.py", track=["neptune:x"])
    monkeypatch.setitem(sys.modules, "mlflow", None)
    with pytest.raises(ValidationError, match=r"corral\[mlflow\]"):
        JobRequest(script="train.py", track=["mlflow:sqlite:///m.db"])


# -- the forwarding thread ---------------------------------------------------------------


def _run_info() -> RunInfo:
    from pathlib import Path

    return RunInfo(job_id="j1", params={"script": "train.py"}, job_dir=Path("runs/j1"))


def test_records_reach_every_tracker_in_order_batched() -> None:
    gate = threading.Event()
    a, b = Recorder(TB, gate=gate), Recorder(ML)
    fwd = _forwarder(a, b)
    fwd.start_run(_run_info())
    for step in range(50):  # queued while the first log() waits at the gate
        fwd.log([Point("loss", 1.0 / (step + 1), step, 0.0)])
    gate.set()
    fwd.finish(FinalState("succeeded", 0))
    assert fwd.close(10)
    for tracker in (a, b):
        assert tracker.run is not None and tracker.run.params == {"script": "train.py"}
        assert [p.step for p in tracker.points] == list(range(50))
        assert tracker.final == FinalState("succeeded", 0)
    assert len(a.calls) < 50  # the points behind the first went in batches


def test_a_failing_tracker_is_one_warning_and_the_others_go_on() -> None:
    bad, good = Recorder(TB, fail="log"), Recorder(ML)
    fwd = _forwarder(bad, good)
    fwd.start_run(_run_info())
    fwd.log([Point("loss", 1.0, 0, 0.0)])
    fwd.log([Point("loss", 0.5, 1, 0.0)])
    fwd.finish(FinalState("succeeded", 0))
    assert fwd.close(10)
    warnings = fwd.warnings()
    assert len(warnings) == 1
    assert warnings[0].startswith("tracking: tensorboard (tb) could not log metrics: ")
    assert "500 with details" in warnings[0]
    assert bad.final is None  # dropped after its error
    assert [p.value for p in good.points] == [1.0, 0.5] and good.final is not None


def test_a_tracker_that_cannot_start_is_a_warning() -> None:
    fwd = _forwarder(Recorder(TB, fail="start"))
    fwd.start_run(_run_info())
    fwd.finish(FinalState("failed", 1))
    assert fwd.close(10)
    assert fwd.warnings() == [
        "tracking: tensorboard (tb) could not start its run: connection refused; "
        "it records nothing more for this job"
    ]


def test_a_slow_tracker_never_blocks_the_job() -> None:
    gate = threading.Event()
    slow = Recorder(TB, gate=gate)
    fwd = _forwarder(slow, queue_size=5)
    fwd.start_run(_run_info())
    for step in range(100):  # returns at once although nothing is written
        fwd.log([Point("loss", 1.0, step, 0.0)])
    warnings = fwd.warnings()
    assert len(warnings) == 1 and "points are dropped" in warnings[0]
    gate.set()
    fwd.finish(FinalState("succeeded", 0))
    assert fwd.close(10)
    assert 0 < len(slow.points) < 100 and slow.final is not None


def test_close_waits_a_bounded_time_for_a_stuck_tracker() -> None:
    gate = threading.Event()
    fwd = _forwarder(Recorder(TB, gate=gate))
    fwd.start_run(_run_info())
    fwd.log([Point("loss", 1.0, 0, 0.0)])
    fwd.finish(FinalState("succeeded", 0))
    assert not fwd.close(0.2)
    assert "did not finish writing within 0.2 s" in fwd.warnings()[-1]
    gate.set()


# -- job events as records ---------------------------------------------------------------


class _Job:
    """What the subscriber needs of a Job: its id and emit (to every subscriber)."""

    job_id = "j1"
    cluster = Cluster((Host("a", slots=1), Host("b", slots=1)), source="test")

    def __init__(self) -> None:
        self.subscribers: list[Any] = []
        self.seen: list[JobEvent] = []

    def emit(self, event: JobEvent) -> None:
        for subscriber in self.subscribers:
            subscriber(event)


def _result(state: JobState, code: int, failures: list[Failure]) -> JobResult:
    return JobResult("j1", state, code, [], failures, 0.0, 1.0, reason="rank 1 exited with 3")


def test_job_events_become_params_points_and_the_final_state() -> None:
    rec = Recorder(TB)
    fwd = _forwarder(rec)
    spec = JobSpec(script="train.py", args=("--steps", "3"), job_id="j1", run_dir="runs")
    job = _Job()
    policy = TrackPolicy(("tensorboard:tb",), name="resnet-a", owner="alice")
    sub = TrackingSubscriber(cast(Job, job), spec, fwd, policy)
    job.subscribers = [sub.on_event, job.seen.append]
    job.emit(
        AttemptStarted(
            job_id="j1", number=0, hosts=["a", "b"], world_size=2, launcher="torchrun",
            workload_weights=[0.6, 0.4], time=100.0,
        )
    )  # fmt: skip
    for step in range(3):
        for rank in (0, 1):
            metrics = {"loss": 1.0 / (step + 1), "examples": 8, "note": "text", "bad": None}
            job.emit(
                Progress(
                    job_id="j1", host="ab"[rank], rank=rank, step=step, metrics=metrics,
                    time=100.0 + step, gpu={"util": 50, "index": 0} if rank == 0 else None,
                )
            )  # fmt: skip
    failure = Failure("b", 1, 3, 103.0, "exited with 3", [])
    job.emit(
        Finished(
            job_id="j1", state=JobState.FAILED, exit_code=3,
            result=_result(JobState.FAILED, 3, [failure]),
        )
    )  # fmt: skip
    assert rec.run is not None
    assert rec.run.params == {
        "job_id": "j1",
        "script": "train.py",
        "args": "--steps 3",
        "launcher": "torchrun",
        "world_size": 2,
        "nnodes": 2,
        "hosts": "a,b",
        "name": "resnet-a",
        "owner": "alice",
        "nproc_per_node": 1,  # the hosts' slots (the spec left it to them)
        "workload_weights": "0.6,0.4",
    }
    assert (rec.run.title, rec.run.owner) == ("resnet-a", "alice")
    series: dict[str, list[tuple[int, float]]] = {}
    for p in rec.points:
        series.setdefault(p.name, []).append((p.step, p.value))
    assert series["loss"] == [(0, 1.0), (1, 0.5), (2, 1.0 / 3)]
    assert series["rank1/loss"] == series["loss"]
    assert series["throughput/rank1/steps_per_s"] == [(1, 1.0), (2, 1.0)]
    assert series["throughput/rank0/examples_per_s"] == [(1, 8.0), (2, 8.0)]
    assert series["gpu/rank0/util"] == [(0, 50.0), (1, 50.0), (2, 50.0)]
    assert series["attempt"] == [(0, 0.0)] and series["world_size"] == [(0, 2.0)]
    assert "note" not in series and "bad" not in series
    assert rec.final == FinalState(
        "failed", 3, 1, "rank 1 exited with 3", {"root_cause": "b rank 1: exited with 3"}
    )  # written before Finished returned: the flush is part of the job's end


def test_a_tracker_warning_reaches_the_job_before_finished() -> None:
    fwd = _forwarder(Recorder(TB, fail="finish_never"), Recorder(ML, fail="log"))
    spec = JobSpec(script="train.py", job_id="j1", run_dir="runs")
    job = _Job()
    sub = TrackingSubscriber(cast(Job, job), spec, fwd)
    job.subscribers = [sub.on_event, job.seen.append]
    job.emit(AttemptStarted(job_id="j1", number=0, hosts=["a"], world_size=1))
    job.emit(Progress(job_id="j1", host="a", rank=0, step=0, metrics={"loss": 1.0}))
    job.emit(
        Finished(
            job_id="j1", state=JobState.SUCCEEDED, exit_code=0,
            result=_result(JobState.SUCCEEDED, 0, []),
        )
    )  # fmt: skip
    kinds = [e.kind for e in job.seen]
    assert kinds[-1] == "finished"
    messages = [e for e in job.seen if isinstance(e, Message)]
    assert [m.level for m in messages] == ["warning"]
    assert "mlflow (sqlite:///m.db) could not log metrics" in messages[0].text


def test_a_job_that_never_started_opens_no_run() -> None:
    rec = Recorder(TB)
    fwd = _forwarder(rec)
    job = _Job()
    sub = TrackingSubscriber(cast(Job, job), JobSpec(script="t.py", job_id="j1"), fwd)
    result = _result(JobState.CANCELLED, 130, [])
    sub.on_event(Finished(job_id="j1", state=JobState.CANCELLED, exit_code=130, result=result))
    assert rec.run is None and rec.final is None


def test_the_job_description_carries_track_to_the_supervisor() -> None:
    from corral.job.describe import JobDescription

    options = JobOptions(
        command=("train.py",), track=("tensorboard:tb", "wandb:p"), name="resnet", owner="bob"
    )
    described = JobDescription(options, Cluster((Host("a"),), source="a"))
    again = JobDescription.from_json(described.to_json())
    assert again.options.track == ("tensorboard:tb", "wandb:p")
    _, made = build_job(again.options)
    assert [str(t) for t in made.tracking.targets] == ["tensorboard:tb", "wandb:p"]
    assert (made.tracking.name, made.tracking.owner) == ("resnet", "bob")


def test_a_server_jobs_description_names_it_and_its_owner(tmp_path: Path) -> None:
    """The API's --name and the job's owner reach the supervisor's trackers."""
    from corral.service.planner import job_description
    from corral.service.settings import ServerSettings
    from tests.unit.test_service_planner import machine

    (tmp_path / "train.py").write_text("")
    request = JobRequest(script=str(tmp_path / "train.py"), name="resnet", track=["tensorboard:tb"])
    settings = ServerSettings(run_dir=tmp_path / "runs")
    described = job_description("j1", request, [machine("a")], settings, owner="bob")
    _, made = build_job(described.options)
    assert (made.tracking.name, made.tracking.owner) == ("resnet", "bob")


def test_the_mlflow_run_is_named_after_the_job_and_records_its_owner(tmp_path: Path) -> None:
    require("mlflow", "the [mlflow] extra: make setup")
    from mlflow.tracking import MlflowClient

    from corral.track.mlflow import MlflowTracker

    store = f"file:{tmp_path / 'mlruns'}"
    tracker = MlflowTracker(TrackTarget("mlflow", store))
    run = RunInfo(job_id="j1", params={}, job_dir=tmp_path, name="resnet", owner="alice")
    tracker.start(run)
    tracker.start(RunInfo(job_id="j2", params={}, job_dir=tmp_path))
    got = MlflowClient(tracking_uri=store).get_run(tracker.run_id)
    assert got.info.run_name == "j2"  # no name: the job id
    named = MlflowClient(tracking_uri=store).search_runs(
        [got.info.experiment_id], "tags.`corral.job_id` = 'j1'"
    )
    assert [r.info.run_name for r in named] == ["resnet"]
    assert named[0].data.tags["corral.owner"] == "alice"
    assert named[0].data.tags["mlflow.user"] == "alice"


def test_nproc_per_node_is_recorded_as_asked_else_from_the_hosts_slots() -> None:
    fwd = _forwarder(Recorder(TB))
    job = _Job()
    job.cluster = Cluster((Host("a", slots=2), Host("b", slots=4)), source="test")
    started = AttemptStarted(job_id="j1", number=0, hosts=["a", "b"], world_size=6)
    sub = TrackingSubscriber(cast(Job, job), JobSpec(script="t.py", job_id="j1"), fwd)
    assert sub._nproc(started) == "2,4"
    asked = JobSpec(script="t.py", job_id="j1", nproc_per_node=3)
    assert TrackingSubscriber(cast(Job, job), asked, fwd)._nproc(started) == 3
    fwd.close(10)
