"""The actors runtime takes the job's options (corral.job.schema.JobOptions) through the
one builder (corral.job.build.ready_ranks): an option means the same for its workers as
for ``corral run``'s ranks, and one it does not offer is refused with the schema's
reason. Real worker processes on this machine (stdlib only, no torch)."""

from __future__ import annotations

import textwrap
from pathlib import Path
from typing import Any

import pytest

from corral.actors import Cluster, WorkerRestarted
from corral.errors import ConfigError
from corral.job.schema import JobOptions

WORK = textwrap.dedent(
    """
    import os

    def env(handle):
        keys = handle.recv()
        handle.send({k: os.environ.get(k) for k in keys})
        handle.recv()

    def die_once(handle):
        if handle.recv() == "die" and not os.path.exists("died"):
            open("died", "w").close()
            os._exit(7)
        handle.send(("alive", handle.rank))
        handle.recv()
    """
)


@pytest.fixture
def work(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    (tmp_path / "opt_work.py").write_text(WORK)
    monkeypatch.chdir(tmp_path)
    return str(tmp_path / "opt_work.py")


def test_the_jobs_options_reach_every_worker(work: str, tmp_path: Path) -> None:
    options = JobOptions(
        env={"FOO": "bar"},
        collective_timeout=42,
        checkpoint_dir="ckpt",
        job_id="opts-job",
        nccl_interface="lo",
    )
    keys = ["FOO", "CORRAL_DIST_TIMEOUT", "CORRAL_CHECKPOINT_DIR", "CORRAL_JOB_ID"]
    keys += ["NCCL_SOCKET_IFNAME", "RANK", "WORLD_SIZE", "CORRAL_ACTOR"]
    with Cluster.from_hosts(
        "local:2", workers_per_host=1, run_dir=None, echo=False, options=options
    ) as cluster:
        cluster.start(f"{work}:env", wait_time=60)
        found = cluster.call(keys, timeout=60)
    common = {
        "FOO": "bar",
        "CORRAL_DIST_TIMEOUT": "42",
        "CORRAL_CHECKPOINT_DIR": str(tmp_path / "ckpt"),
        "CORRAL_JOB_ID": "opts-job",
        "NCCL_SOCKET_IFNAME": "lo",
        "WORLD_SIZE": "2",
        "CORRAL_ACTOR": "1",
    }
    assert found == [{**common, "RANK": "0"}, {**common, "RANK": "1"}]
    assert cluster.job_id == "opts-job"


def test_the_options_restart_policy_restarts_a_worker(work: str) -> None:
    """--max-restarts / --restart-backoff of the options, not start()'s argument."""
    options = JobOptions(max_restarts=1, restart_backoff=0.0)
    with Cluster.from_hosts("local:1", run_dir=None, echo=False, options=options) as cluster:
        (worker,) = cluster.start(f"{work}:die_once", wait_time=60)
        worker.send("die")
        with pytest.raises(WorkerRestarted):
            worker.recv(timeout=60)
        worker.send("again")
        assert worker.recv(timeout=60) == ("alive", 0)
        assert worker.restarts == 1


@pytest.mark.parametrize(
    ("changes", "option", "why"),
    [
        ({"recovery": "in-place"}, "--recovery", "no in-place recovery yet"),
        ({"ft_sync": "diloco"}, "--ft-sync", "no in-place recovery yet"),
        ({"hang_timeout": 30.0}, "--hang-timeout", "recv/call timeouts"),
        ({"preflight": False}, "--no-preflight", "no pre-flight"),
        ({"env": {"RANK": "3"}}, "--env", "set by corral for every rank"),
        ({"collective_timeout": -1.0}, "--collective-timeout", "must be"),
    ],
)
def test_an_option_is_refused_as_the_schema_says(
    work: str, changes: dict[str, Any], option: str, why: str
) -> None:
    """Refused before any worker starts, naming the option (and, for one the actors
    runtime does not offer, the schema's reason)."""
    cluster = Cluster.from_hosts("local:1", run_dir=None, echo=False, options=JobOptions(**changes))
    with pytest.raises(ConfigError, match=why) as caught:
        cluster.start(f"{work}:env", wait_time=60)
    assert caught.value.option == option
    assert cluster.workers == []
