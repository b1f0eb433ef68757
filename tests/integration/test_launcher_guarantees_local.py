"""The new launchers keep corral's guarantees on ``local:2`` (real processes): the
pre-flight refuses a host without what the launcher needs (Accelerate, MLX; torch
not for MLX) and says why the smoke test cannot run for MLX without torch;
``job.json`` records a command job's rendered command (redacted) and the summary
shows each node's own exit code; an MLX job waits for no master."""

from __future__ import annotations

import json
import re
import sys
import venv
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import require

from .conftest import REPO, run_corral, wait_no_job_processes
from .test_local_jobs import _common

SITE = Path(next(p for p in sys.path if p.endswith("site-packages")))


@pytest.fixture(scope="module")
def bare_python(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A real interpreter that finds corral (its source tree) and nothing else of
    this one's packages: no torch, no Accelerate, no MLX."""
    root = tmp_path_factory.mktemp("bare-env")
    venv.EnvBuilder(with_pip=False, symlinks=True).create(root)
    site = next((root / "lib").glob("python3*/site-packages"))
    (site / "corral-src.pth").write_text(str(REPO / "src") + "\n")
    return root / "bin" / "python"


def _python_with(bare: Path, tmp_path: Path, *packages: str) -> Path:
    """``bare`` plus ``packages`` of this interpreter's site-packages (linked, so
    each is found as installed; nothing is imported by the checks)."""
    shim = tmp_path / "shim"
    shim.mkdir()
    for name in packages:
        require(name)
        (shim / name).symlink_to(SITE / name)
    site = next((bare.parent.parent / "lib").glob("python3*/site-packages"))
    (site / "shim.pth").write_text(str(shim) + "\n")
    return bare


@pytest.fixture
def clean_bare(bare_python: Path) -> Any:
    """``bare_python`` with no shim left from another test."""
    yield bare_python
    for pth in (bare_python.parent.parent / "lib").glob("python3*/site-packages/shim.pth"):
        pth.unlink()


def _check(tmp_path: Path, python: Path, *args: str) -> tuple[int, dict[str, Any]]:
    result = run_corral(
        "check", "--hosts", "local:2", "--python", str(python), "--json", *args, cwd=tmp_path
    )
    assert result.stdout.startswith("{"), result.stderr[-3000:]
    report = json.loads(result.stdout)
    return result.returncode, {c["name"]: c for c in report["checks"]}


def test_accelerate_missing_fails_the_check_with_its_fix(clean_bare: Path, tmp_path: Path) -> None:
    python = _python_with(clean_bare, tmp_path, "torch")
    code, checks = _check(tmp_path, python, "--launcher", "accelerate", "--no-smoke-test")
    assert code == 1
    sw = checks["software"]
    assert sw["status"] == "fail"
    for host in ("local-0", "local-1"):
        detail = sw["hosts"][host]["detail"]
        assert detail == f"accelerate cannot be imported by {python} (--launcher accelerate)"
    assert f"{python} -m pip install accelerate  (on local-0)" in sw["fix_command"]

    # with Accelerate found too, the software check passes
    (tmp_path / "shim" / "accelerate").symlink_to(SITE / "accelerate")
    code, checks = _check(tmp_path, python, "--launcher", "accelerate", "--no-smoke-test")
    assert checks["software"]["status"] == "pass", checks["software"]


def test_mlx_missing_fails_and_torch_is_never_required(clean_bare: Path, tmp_path: Path) -> None:
    code, checks = _check(tmp_path, clean_bare, "--launcher", "mlx", "--no-smoke-test")
    assert code == 1
    detail = checks["software"]["hosts"]["local-1"]["detail"]
    assert f"MLX is not installed for {clean_bare} (--launcher mlx needs it" in detail
    assert "torch" in detail and "torch is not installed" not in detail
    assert f"{clean_bare} -m pip install 'mlx[cpu]'" in checks["software"]["fix_command"]

    # MLX there, torch not: the software check passes; the smoke test (torch) is skipped
    # with a warning naming why, which does not fail the checklist
    python = _python_with(clean_bare, tmp_path, "mlx")
    code, checks = _check(tmp_path, python, "--launcher", "mlx", "--smoke-test")
    assert checks["software"]["status"] == "pass", checks["software"]
    assert checks["software"]["hosts"]["local-0"]["detail"].startswith("python 3.")
    collective = checks["collective"]
    assert collective["status"] == "warn"
    assert (
        "runs torch.distributed and torch is not installed on local-0, local-1"
        in (collective["warning"])
    )
    assert "--launcher mlx does not need torch" in collective["warning"]
    assert code == 0


def test_the_harness_refuses_a_host_without_accelerate_before_launch(
    clean_bare: Path, tmp_path: Path, run_dir: Path
) -> None:
    python = _python_with(clean_bare, tmp_path, "torch")
    script = tmp_path / "plugin.py"
    script.write_text("print('STARTED', flush=True)\n")
    config = tmp_path / "config.json"
    config.write_text(json.dumps({"batch_size": 8, "learning_rate": 0.1}))
    job = "harness-no-accelerate"
    result = run_corral(
        *_common(run_dir, job, nproc=1),
        "--launcher",
        "python",
        "--harness",
        "--python",
        str(python),
        "--",
        str(script),
        "--config_file",
        str(config),
        cwd=tmp_path,
    )
    assert result.returncode == 2, result.stderr[-3000:]
    assert f"accelerate cannot be imported by {python} (--harness sets up Accelerate)" in (
        result.stderr
    )
    assert f"{python} -m pip install accelerate" in result.stderr
    assert "STARTED" not in result.stdout
    assert not wait_no_job_processes(job, within=10)


def test_a_command_job_records_its_command_and_each_nodes_exit_code(
    run_dir: Path, tmp_path: Path
) -> None:
    job = "command-record"
    secret = "hf_s3cr3t_value"
    template = (
        "echo node {node_rank} of {nnodes} MY_TOKEN=abc123; "
        "if [ {node_rank} = 1 ]; then exit 9; fi; exec sleep 600"
    )
    result = run_corral(
        *_common(run_dir, job, nproc=1),
        "--no-preflight",
        "--env",
        f"HF_TOKEN={secret}",
        "--launcher",
        "command",
        "--command-template",
        template + f" # {secret}",
        cwd=tmp_path,
    )
    assert result.returncode == 9, result.stderr[-3000:]
    assert "[local-1] node 1 of 2 MY_TOKEN=abc123" in result.stdout
    # the summary's exit column: the node's own code (no ranks are known for a command)
    rows = {m[1]: m[2] for m in re.finditer(r"│ (local-\d) │ - +│ \w+ +│ (\S+) ", result.stderr)}
    assert rows == {"local-0": "SIGTERM", "local-1": "9"}, result.stderr[-2000:]
    record = json.loads((run_dir / job / "job.json").read_text())
    rendered = (
        "echo node {} of 2 MY_TOKEN=<redacted>; "
        "if [ {} = 1 ]; then exit 9; fi; exec sleep 600 # <redacted>"
    )
    assert record["command"] == ["bash", "-c", rendered.format(0, 0)]
    assert [h["argv"][2] for h in record["hosts"]] == [rendered.format(0, 0), rendered.format(1, 1)]
    assert record["command_template"] == template.replace("abc123", "<redacted>") + (
        " # <redacted>"
    )
    assert secret not in (run_dir / job / "job.json").read_text()
    assert not wait_no_job_processes(job, within=30)


def test_an_mlx_job_waits_for_no_master(run_dir: Path, tmp_path: Path) -> None:
    require("mlx.core", "the mlx extra: make setup")
    job = "mlx-no-master"
    result = run_corral(
        *_common(run_dir, job, nproc=1),
        "--no-preflight",
        "--launcher",
        "mlx",
        "--",
        str(REPO / "examples" / "mlx_all_sum.py"),
        cwd=tmp_path,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert "[local-1:1] rank 1/2 all_sum=3" in result.stdout
    assert "Waiting for" not in result.stderr and "Master node" not in result.stderr
