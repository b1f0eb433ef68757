"""GPU samples during a run: the agent's per-rank assignment, the event fields that
carry them, the store and the ``/metrics`` gauges; a no-op without GPUs."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from corral.agent.events import parse_event
from corral.agent.gpusample import GpuSampler, assign
from corral.api.metrics import Metrics
from corral.job.events import GPU_KEY, Progress
from corral.service.ingest import _progress
from corral.store.db import open_store
from corral.store.models import Job

GPUS = [
    {"index": 0, "util": 10, "mem_used_mib": 100, "mem_total_mib": 81559, "temp_c": 40, "pids": []},
    {"index": 1, "util": 90, "mem_used_mib": 30000, "mem_total_mib": 81559, "temp_c": 70,
     "pids": [4242]},
    {"index": 2, "util": 50, "mem_used_mib": 200, "mem_total_mib": 81559, "temp_c": 50, "pids": []},
]  # fmt: skip


def test_a_rank_gets_the_gpu_that_runs_its_pid_else_its_local_ranks() -> None:
    got = assign(GPUS, {0: (4242, 0), 1: (7, 1), 2: (None, 9)})
    assert got[0]["index"] == 1 and got[0]["util"] == 90  # found by its PID
    assert got[1]["index"] == 1  # local rank 1, no PID on any GPU
    assert 2 not in got  # no GPU 9
    assert set(got[0]) == {"index", "util", "mem_used_mib", "mem_total_mib", "temp_c"}


def test_cuda_visible_devices_maps_local_ranks_to_physical_gpus() -> None:
    got = assign(GPUS, {0: (None, 0), 1: (None, 1)}, visible="2,0")
    assert (got[0]["index"], got[1]["index"]) == (2, 0)


def test_without_gpus_the_agent_has_no_sampler() -> None:
    assert not list(Path("/dev").glob("nvidia[0-9]*"))  # this machine
    assert GpuSampler.open() is None


def _report(gpu: object) -> bytes:
    return json.dumps(
        {"event": "report", "type": "progress", "rank": 1, "time": 1.0, "step": 3, "gpu": gpu}
    ).encode()


def test_a_progress_report_carries_its_gpu_sample_through_validation() -> None:
    sample = {"index": 1, "util": 90, "mem_used_mib": 30000, "mem_total_mib": 81559, "temp_c": 70}
    assert parse_event(_report(sample))["gpu"] == sample
    assert parse_event(_report(None))["gpu"] is None
    with pytest.raises(ValueError, match="util"):
        parse_event(_report({**sample, "util": 101}))


def test_the_store_keeps_the_sample_and_metrics_exposes_gauges(tmp_path: Path) -> None:
    store = open_store(f"sqlite:///{tmp_path / 'corral.db'}")
    sample = {"index": 1, "util": 90, "mem_used_mib": 2, "mem_total_mib": 81559, "temp_c": 70}
    with store.session() as s:
        job = Job(id="j1", state="running", created=time.time())
        s.add(job)
        _progress(s, job, Progress(job_id="j1", host="g1", rank=0, step=5, metrics={"loss": 1.5},
                                   gpu=sample))  # fmt: skip
        assert job.last_metrics["loss"] == 1.5 and GPU_KEY not in job.last_metrics
        s.commit()
    text = Metrics(store).render().decode()
    labels = 'gpu="1",host="g1",job_id="j1",rank="0"'
    assert f"corral_rank_gpu_utilization_percent{{{labels}}} 90.0" in text
    assert f"corral_rank_gpu_memory_used_bytes{{{labels}}} 2.097152e+06" in text
    assert f"corral_rank_gpu_temperature_celsius{{{labels}}} 70.0" in text
