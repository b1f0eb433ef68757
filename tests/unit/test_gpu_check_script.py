"""``make gpu-check`` (``scripts/gpu_check.py``): the CPU dry run of its plumbing on this
machine, and how each step is marked on a GPU machine: ``ok`` with its figure, ``FAIL``
with the reason, command and last output lines, ``SKIPPED`` with the reason when it
needs more GPUs than the machine has (real processes stand in for the steps' commands:
this machine has no GPU)."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from datetime import datetime, timezone
from pathlib import Path
from types import ModuleType

import pytest

from corral.throughput.model import Calibration, CalibrationFile, RankRate

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def gpu_check() -> ModuleType:
    spec = importlib.util.spec_from_file_location("gpu_check", ROOT / "scripts" / "gpu_check.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["gpu_check"] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def test_without_gpus_it_says_so_and_checks_its_plumbing() -> None:
    assert not list(Path("/dev").glob("nvidia[0-9]*"))  # this machine has no GPU
    proc = subprocess.run(
        [sys.executable, "scripts/gpu_check.py"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    out = proc.stdout
    assert "no GPUs on this machine: CPU dry run of the plumbing" in out
    rows = {ln.split()[0]: ln for ln in out.splitlines()[3:] if ln.strip()}
    assert "skip: no GPUs" in rows["nvml"] and rows["nvml"].split()[1] == "ok"
    for step in (
        "ddp-1gpu",
        "nccl-ddp",
        "fsdp2-bf16-1gpu",
        "fsdp2-bf16",
        "calibrate",
        "bench-launch",
        "bench-teardown",
    ):
        assert "skipped (no GPU)" in rows[step]
    assert "--bf16" in rows["fsdp2-bf16"] and "--nproc-per-node 1" in rows["ddp-1gpu"]
    assert rows["plan"].split()[1] == "ok"


def _ranks(argv: list[str], flag: str = "--nproc-per-node") -> str:
    return argv[argv.index(flag) + 1]


def _stand_in(step: object, marker: Path, code: int = 0, said: str = "figure") -> None:
    """Replace a step's command by a real process that leaves ``marker`` behind."""
    script = (
        f"import sys; open({str(marker)!r}, 'w').close(); "
        f"print({said!r}); print('stderr line', file=sys.stderr); sys.exit({code})"
    )
    step.argv = [sys.executable, "-c", script]  # type: ignore[attr-defined]
    step.figure = lambda out: out.strip().splitlines()[-1] if out.strip() else ""  # type: ignore[attr-defined]


def test_one_gpu_runs_what_one_gpu_allows_and_skips_each_multi_gpu_step_with_the_reason(
    gpu_check: ModuleType, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    todo = gpu_check.steps(1, 5, True, tmp_path)
    by_name = {s.name: s for s in todo}
    assert _ranks(by_name["ddp-1gpu"].argv) == "1"
    assert _ranks(by_name["nccl-ddp"].argv) == "2"  # two NCCL ranks
    assert _ranks(by_name["fsdp2-bf16"].argv, "--workers-per-host") == "2"
    assert "CORRAL_BACKEND=nccl" in by_name["nccl-ddp"].argv  # the pre-flight is strict
    for s in todo:
        _stand_in(s, tmp_path / f"{s.name}.ran")
    assert gpu_check.run_all(todo, 1, "gpu-check on 1x H200:") == 0
    out = capsys.readouterr().out
    rows = {ln.split()[0]: ln for ln in out.split("gpu-check on 1x H200:")[1].splitlines()[2:]}
    skipped = {s.name for s in todo if s.result == "SKIPPED"}
    assert skipped == {"nccl-ddp", "fsdp2-bf16"}
    for name in skipped:
        assert not (tmp_path / f"{name}.ran").exists()  # never started
        assert rows[name].split()[1] == "SKIPPED"
        assert "needs >= 2 GPUs (" in rows[name] and "this machine has 1" in rows[name]
    assert "Duplicate GPU detected" in by_name["nccl-ddp"].detail
    assert "sharded across GPUs" in by_name["fsdp2-bf16"].detail
    for s in todo:
        if s.name not in skipped:
            assert (tmp_path / f"{s.name}.ran").exists()
            assert (s.result, s.detail) == ("ok", "figure")
    # with two GPUs nothing is skipped and the multi-GPU steps use every GPU
    four = gpu_check.steps(4, 5, True, tmp_path)
    assert [_ranks(s.argv) for s in four if s.name == "nccl-ddp"] == ["4"]
    for s in four:
        _stand_in(s, tmp_path / f"four-{s.name}.ran")
    assert gpu_check.run_all(four, 4, "gpu-check on 4x H200:") == 0
    assert {s.result for s in four} == {"ok"}


def test_a_failing_step_or_one_without_its_figure_is_fail_with_its_command_and_output(
    gpu_check: ModuleType, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A benchmark that exits 1 (its runs failed) and a calibrate that printed no
    figure are both FAIL, never ok; the exit code is 1."""
    bench = gpu_check.Step("bench-teardown", [], 60, gpu_check._last_line)
    _stand_in(bench, tmp_path / "b", code=1, said="teardown: FAILED: run python/sleep round 1")
    calibrate = gpu_check.Step("calibrate", [], 60, gpu_check._calibration)
    _stand_in(calibrate, tmp_path / "c", said="{}")
    calibrate.figure = gpu_check._calibration
    fine = gpu_check.Step("bench-launch", [], 60)
    _stand_in(fine, tmp_path / "n")
    nvml = gpu_check.steps(1, 5, True, tmp_path)[0]  # corral check --json: says which check
    report = {"checks": [{"name": "software", "status": "fail", "error": "local-0: no torch"}]}
    _stand_in(nvml, tmp_path / "v", code=1, said=json.dumps(report, indent=2))
    assert gpu_check.run_all([fine, nvml, bench, calibrate], 1, "on 1x H200:") == 1
    assert (fine.result, nvml.result, bench.result, calibrate.result) == (
        "ok",
        "FAIL (exit 1)",
        "FAIL (exit 1)",
        "FAIL (no figure)",
    )
    assert nvml.detail == "software: local-0: no torch"
    assert bench.detail == "stderr line"
    assert calibrate.detail.startswith("exit 0 but no figure in its output")
    out = capsys.readouterr().out
    failed = out.split("gpu-check: failed steps:")[1]
    assert "bench-teardown: FAIL (exit 1)" in failed and "command: " in failed
    assert "teardown: FAILED: run python/sleep round 1" in failed  # its last output lines
    assert "calibrate: FAIL (no figure)" in failed


def test_the_calibrate_figure_is_read_from_corral_calibrates_json(gpu_check: ModuleType) -> None:
    """The empty figure the GPU machine showed: the JSON is the calibration file, whose
    ranks sit under ``hardware_calibration``."""
    ranks = [
        RankRate(rank=i, host="local-0", local_rank=i, examples_per_s=rate, share=0.5)
        for i, rate in enumerate((412.0, 205.3))
    ]
    cal = Calibration(
        measured_performance={"local-0": 617.3},
        workload_distribution={"local-0": 1.0},
        calibration_notes="",
        when=datetime.now(timezone.utc),
        job_id="cal",
        seconds=10.0,
        hosts=["local-0"],
        ranks=ranks,
    )
    out = "calibrating...\n" + CalibrationFile(hardware_calibration=cal).model_dump_json(indent=2)
    assert gpu_check._calibration(out) == "2 rank(s), 205-412 examples/s"
    assert gpu_check._calibration('{"hardware_calibration": {"ranks": []}}') == ""
