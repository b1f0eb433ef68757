"""One job model: ``corral run`` and the server's supervisor process build a job with
the same function (:func:`corral.job.build.build_job`), so they accept and refuse the
same jobs with the same errors; Ctrl-C / SIGTERM map to a stop the same way
everywhere (:func:`corral.signals.stop_on_signals`)."""

from __future__ import annotations

import asyncio
import dataclasses
import os
import signal
from pathlib import Path

import pytest

from corral.cluster import load_cluster
from corral.cluster.model import Cluster, Host
from corral.errors import ConfigError
from corral.job.build import Policies, build_job, job_spec, new_job
from corral.job.describe import JobDescription, JobOptions
from corral.job.options import (
    CheckpointPolicy,
    CheckPolicy,
    RestartPolicy,
    SupervisionPolicy,
    SyncPolicy,
)
from corral.service.launch import handover, job_of, received
from corral.signals import STOP_SIGNALS, stop_on_signals


def _request(**fields: object) -> JobDescription:
    """The description the supervisor receives (through its stdin handover)."""
    script = str(fields.pop("script", "train.py"))
    options = JobOptions(command=(script,), job_id="j1", run_dir="runs", **fields)  # type: ignore[arg-type]
    hosts = (Host(name="n0", local=True), Host(name="n1", local=True))
    return received(handover(JobDescription(options, Cluster(hosts))))


def test_defaults_are_the_engines_defaults() -> None:
    spec, made = build_job(JobOptions(command=("train.py", "--lr", "1")))
    assert made == Policies()
    assert (spec.script, spec.args, spec.launcher) == ("train.py", ("--lr", "1"), "torchrun")
    assert spec.job_id


def test_the_supervisor_builds_the_policies_corral_run_builds() -> None:
    request = _request(
        max_restarts=2,
        restart_backoff=0.5,
        min_nodes=1,
        grace=3.0,
        host_timeout=7.0,
        hang_timeout=9.0,
        checkpoint_dir="/ckpt",
        replicate_checkpoints=True,
        preflight=False,
        smoke_test=True,
        sync=True,
        code_dir="src",
    )
    job = job_of(request)
    assert job.restarts == RestartPolicy(2, 0.5, 1)
    assert job.supervision == SupervisionPolicy(3.0, 7.0, 9.0)
    assert job.checkpoints == CheckpointPolicy("/ckpt", True)
    assert job.checks == CheckPolicy(enabled=False, smoke_test=True, code_dir="src")
    assert job.sync == SyncPolicy(push=True, source="src")
    _, made = build_job(request.options)
    cli = JobOptions(
        command=("train.py",),
        max_restarts=2,
        restart_backoff=0.5,
        min_nodes=1,
        grace=3.0,
        host_timeout=7.0,
        hang_timeout=9.0,
        checkpoint_dir="/ckpt",
        replicate_checkpoints=True,
        preflight=False,
        smoke_test=True,
        sync=True,
        code_dir="src",
    )
    assert build_job(cli)[1] == made


@pytest.mark.parametrize(
    ("fields", "option"),
    [
        ({"launcher": "command", "command_template": "echo {host}"}, "--launcher"),
        ({"launcher": "command", "script": ""}, "--command-template"),
        ({"replicate_checkpoints": True}, "--replicate-checkpoints"),
        ({"grace": -1.0}, "--grace"),
        ({"script": ""}, None),
    ],
)
def test_the_supervisor_refuses_what_corral_run_refuses(
    fields: dict[str, object], option: str | None
) -> None:
    request = _request(**fields)
    with pytest.raises(ConfigError) as from_server:
        job_of(request)
    with pytest.raises(ConfigError) as from_cli:
        build_job(request.options)
    assert from_server.value.option == from_cli.value.option == option
    assert str(from_server.value) == str(from_cli.value)


def test_launch_options_are_checked_with_the_option_named() -> None:
    with pytest.raises(ConfigError, match="unknown MLX backend") as exc:
        job_spec(JobOptions(command=("t.py",), launcher="mlx", mlx_backend="nope"))
    assert exc.value.option == "--mlx-backend"
    with pytest.raises(ConfigError) as exc:
        job_spec(JobOptions(command=("t.py",), qos="fastest"))
    assert exc.value.option == "--qos"
    with pytest.raises(ConfigError, match="no script given"):
        job_spec(JobOptions())
    assert job_spec(JobOptions(launcher="command", command_template="echo hi")).script == ""


def test_new_job_carries_spec_and_policies() -> None:
    cluster = load_cluster("local:2")
    spec, made = build_job(JobOptions(command=("t.py",), max_restarts=1, checkpoint_dir="/c"))
    job = new_job(spec, cluster, made)
    assert job.restarts.max_restarts == 1
    assert job.spec.checkpoint_dir == "/c"
    with pytest.raises(ConfigError) as exc:
        new_job(spec, cluster, Policies(restarts=RestartPolicy(min_nodes=3)))
    assert exc.value.option == "--min-nodes"


@pytest.mark.parametrize("signum", STOP_SIGNALS)
def test_a_stop_signal_calls_stop_and_the_old_handler_comes_back(signum: int) -> None:
    calls: list[str] = []
    before = signal.getsignal(signum)

    async def scenario() -> None:
        done = asyncio.Event()

        def stop() -> None:
            calls.append("stop")
            done.set()

        with stop_on_signals(stop):
            os.kill(os.getpid(), signum)
            await asyncio.wait_for(done.wait(), 10)

    asyncio.run(scenario())
    assert calls == ["stop"]
    assert signal.getsignal(signum) == before


def test_the_builder_makes_a_weighted_job_ready_for_every_entry_point(tmp_path: Path) -> None:
    """``ready_job`` (``corral run`` and the supervisor process alike) attaches a weighted
    job's drift monitor itself: its restarts are re-weighed (``rebalance``), its live
    throughput goes to the job dir; a job without weights gets none."""
    from corral.job.build import LIVE_FILE, ready_job
    from corral.job.drift import DriftMonitor

    options = JobOptions(
        command=("train.py",),
        launcher="python",
        job_id="w1",
        run_dir=str(tmp_path),
        workload_weights=(0.75, 0.25),
        rebalance=True,
    )
    cluster = Cluster((Host(name="n0", local=True), Host(name="n1", local=True)))
    for job in (
        ready_job(JobDescription(options, cluster)),
        job_of(received(handover(JobDescription(options, cluster)))),
    ):
        monitor = getattr(job.before_restart, "__self__", None)
        assert isinstance(monitor, DriftMonitor)
        assert monitor.rebalance and monitor.save_to == tmp_path / "w1" / LIVE_FILE
    plain = ready_job(JobDescription(dataclasses.replace(options, workload_weights=()), cluster))
    assert plain.before_restart is None
