"""``corral run --calibration FILE|auto`` on ``local:2``: every rank gets its host's
weight (under torchrun too, whose rendezvous numbers the ranks), ``corral plan``
shows the weights, and the options' errors are one line."""

from __future__ import annotations

import json
import re
from datetime import datetime, timezone
from pathlib import Path

import pytest

from corral.throughput.model import Calibration, RankRate, save_calibration

from .conftest import SCRIPTS, run_corral

EXAMPLE = str(Path(__file__).resolve().parents[2] / "examples" / "train_ddp.py")
SPLIT = re.compile(r"\[(local-\d):(\d)\] rank (\d): weighted split, weight ([0-9.]+), batch (\d+)")


def _calibration(
    tmp_path: Path, rates: dict[str, float], fits: dict[str, int] | None = None
) -> Path:
    """A calibration file as `corral calibrate` writes it, with the given rates (and
    the micro-batch some hosts fit)."""
    total = sum(rates.values())
    ranks = [
        RankRate(
            rank=i,
            host=host,
            local_rank=0,
            examples_per_s=rate,
            share=rate / total,
            examples=rate * 10,
            seconds=10.0,
            reports=20,
            fits=(fits or {}).get(host),
        )
        for i, (host, rate) in enumerate(rates.items())
    ]
    calibration = Calibration(
        measured_performance=dict(rates),
        workload_distribution={h: r / total for h, r in rates.items()},
        calibration_notes="set by the test",
        when=datetime(2026, 11, 24, tzinfo=timezone.utc),
        job_id="calibrate-test",
        seconds=10.0,
        hosts=list(rates),
        ranks=ranks,
        script=None,
        workload="reference",
    )
    return save_calibration(calibration, tmp_path / "cal.json")


def _splits(stdout: str) -> dict[str, tuple[int, float, int]]:
    """host -> (rank, weight, batch) from the example's 'weighted split' lines."""
    return {m[1]: (int(m[3]), float(m[4]), int(m[5])) for m in SPLIT.finditer(stdout)}


@pytest.mark.torch
@pytest.mark.parametrize("launcher", ["torchrun", "python"])
def test_each_host_gets_its_weight_whatever_rank_it_is(tmp_path: Path, launcher: str) -> None:
    # local-1 fits micro-batches of 40: its 192 examples a step run as 5 (accumulation)
    cal = _calibration(tmp_path, {"local-0": 3000.0, "local-1": 9000.0}, {"local-1": 40})
    done = run_corral(
        "run", "--hosts", "local:2", "--launcher", launcher, "--calibration", str(cal),
        "--no-preflight", "--master-port", "0", "--", EXAMPLE, "--steps", "20",
        cwd=tmp_path,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    assert "workload weights (host:local rank): local-0:0 0.250, local-1:0 0.750" in done.stdout
    splits = _splits(done.stdout)
    # torchrun's c10d may give local-0 either rank: the weight follows the host
    assert splits["local-0"][1:] == (0.25, 64) and splits["local-1"][1:] == (0.75, 192), splits
    assert {splits["local-0"][0], splits["local-1"][0]} == {0, 1}
    assert "micro-batch fits (host:local rank): local-1:0 40;" in done.stdout
    # the fits follow the host too (under torchrun they are all-gathered, as the weights)
    assert re.search(
        r"\[local-1:\d\] .*batch 192 as 5 micro-batches \[39, 39, 38, 38, 38\]", done.stdout
    )
    assert re.search(r"\[local-0:\d\] .*batch 64 of 256", done.stdout), done.stdout
    assert "final loss" in done.stdout


@pytest.mark.torch  # the built-in calibration workload imports it
def test_auto_calibrates_first_then_runs_with_the_weights(tmp_path: Path) -> None:
    # the job's ranks: standard library (the example's weights are the subject above,
    # and a rank importing torch costs ~2 CPU-s)
    done = run_corral(
        "run", "--hosts", "local:2", "--launcher", "python", "--calibration", "auto",
        "--calibration-seconds", "1", "--no-preflight", "--master-port", "0",
        "--", str(SCRIPTS / "weights.py"), "--steps", "5",
        cwd=tmp_path,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    assert "ex/s" in done.stdout  # the calibration's table came first
    line = re.search(
        r"workload weights \(host:local rank\): local-0:0 ([0-9.]+), local-1:0 ([0-9.]+)",
        done.stdout,
    )
    assert line, done.stdout
    w0, w1 = float(line[1]), float(line[2])
    assert w0 + w1 == pytest.approx(1.0, abs=0.002)
    got = {
        m[1]: float(m[3])
        for m in re.finditer(r"\[(local-\d):\d\] rank (\d): weight ([0-9.]+)", done.stdout)
    }
    # corral prints the weights to 3 decimals; the ranks print theirs to 4
    assert got["local-0"] == pytest.approx(w0, abs=6e-4), got
    assert got["local-1"] == pytest.approx(w1, abs=6e-4), got
    saved = list((tmp_path / "runs").glob("calibrate-*/calibration.json"))
    assert len(saved) == 1  # the measurement was kept, as corral calibrate keeps it


def test_plan_shows_the_weights(tmp_path: Path) -> None:
    cal = _calibration(tmp_path, {"local-0": 1000.0, "local-1": 3000.0})
    done = run_corral(
        "plan", "--hosts", "local:2", "--launcher", "torchrun", "--calibration", str(cal),
        "--json", "--", EXAMPLE,
        cwd=tmp_path,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    doc = json.loads(done.stdout)
    assert doc["workload_weights"] == [0.25, 0.75]
    envs = [node["env"] for node in doc["nodes"]]
    assert {e["CORRAL_WORKLOAD_WEIGHTS"] for e in envs} == {"0.25,0.75"}
    assert [e["CORRAL_PLAN_NODE"] for e in envs] == ["0", "1"]
    assert {e["CORRAL_PLAN_NPROCS"] for e in envs} == {"1,1"}
    text = run_corral(
        "plan", "--hosts", "local:2", "--calibration", str(cal), "--", EXAMPLE, cwd=tmp_path
    )
    assert "workload weights (host:local rank): local-0:0 0.250, local-1:0 0.750" in text.stdout


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--rebalance"], "--rebalance: needs --calibration FILE|auto"),
        (["--qos", "turbo"], "--qos: unknown QoS class 'turbo'"),
        (["--calibration", "missing.json"], "--calibration"),
    ],
)
def test_bad_options_are_one_line(tmp_path: Path, args: list[str], message: str) -> None:
    done = run_corral(
        "run", "--hosts", "local:2", *args, "--no-preflight", "--", EXAMPLE, cwd=tmp_path
    )
    assert done.returncode == 2, done.stdout + done.stderr
    assert message in done.stderr
    assert "Traceback" not in done.stderr


def test_a_calibration_of_other_hosts_is_refused_by_name(tmp_path: Path) -> None:
    cal = _calibration(tmp_path, {"local-0": 1000.0, "gpu-7": 3000.0})
    done = run_corral(
        "run", "--hosts", "local:2", "--calibration", str(cal), "--no-preflight", "--",
        EXAMPLE, cwd=tmp_path,
    )  # fmt: skip
    assert done.returncode == 2, done.stdout + done.stderr
    assert "local-1" in done.stderr and "corral calibrate" in done.stderr
