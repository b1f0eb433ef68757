"""A relative checkpoint path of the SDK is the job's: under ``$CORRAL_LAUNCH_DIR``,
which the plan gives ``local:N`` nodes (their ranks run in a per-job node dir)."""

from __future__ import annotations

from pathlib import Path

import pytest

from corral import sdk
from corral.cluster.model import Cluster, Host
from corral.plan.render import plan_job
from corral.plan.spec import JobSpec
from corral.sdk._paths import LAUNCH_DIR_ENV, job_path
from tests.conftest import require_torch


def test_a_relative_path_is_under_the_launch_dir(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.delenv(LAUNCH_DIR_ENV, raising=False)
    assert job_path("ckpt") == Path("ckpt")  # plain python / torchrun: the process's own
    monkeypatch.setenv(LAUNCH_DIR_ENV, "/srv/job")
    assert job_path("ckpt") == Path("/srv/job/ckpt")
    assert job_path("/abs/ckpt") == Path("/abs/ckpt")
    monkeypatch.setenv("HOME", str(tmp_path))
    assert job_path("~/ckpt") == tmp_path / "ckpt"
    monkeypatch.setenv(LAUNCH_DIR_ENV, "relative/base")  # not ours: ignored
    assert job_path("ckpt") == Path("ckpt")


def test_checkpoints_and_chunks_use_it(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    require_torch()
    monkeypatch.setenv(LAUNCH_DIR_ENV, str(tmp_path))
    monkeypatch.chdir("/")
    for name in ("RANK", "WORLD_SIZE", "CORRAL_CONTROL", "CORRAL_CHECKPOINT_DIR"):
        monkeypatch.delenv(name, raising=False)
    saved = sdk.save_checkpoint({"step": 3}, "ckpt", 3)
    assert saved == tmp_path / "ckpt" / "ckpt-00000003.pt"
    assert sdk.latest_checkpoint("ckpt") == saved
    assert sdk.load_checkpoint("ckpt/ckpt-00000003.pt") == {"step": 3}
    assert sdk.resume("ckpt") == {"step": 3}
    assert len(list(sdk.chunks(10, 5, checkpoint_dir="ckpt"))) == 2
    assert (tmp_path / "ckpt" / "chunks.json").is_file()


def test_local_nodes_get_the_jobs_working_dir(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir("/")  # the plan reads no cwd: the launch dir is fixed in the spec
    spec = JobSpec(script="/t.py", launcher="python", job_id="j", run_dir="/r", launch_dir="/tmp")
    local = Cluster((Host("local-0", local=True),), source="t")
    (cmd,) = plan_job(spec, local)
    assert cmd.cwd == "/r/j/nodes/local-0/work" and cmd.env[LAUNCH_DIR_ENV] == "/tmp"
    (cmd,) = plan_job(JobSpec(**{**spec.__dict__, "workdir": "/srv/code"}), local)
    assert cmd.env[LAUNCH_DIR_ENV] == "/srv/code"
    (remote,) = plan_job(spec, Cluster((Host("h1"),), source="t"))
    assert LAUNCH_DIR_ENV not in remote.env  # SSH ranks run in the job's working dir
