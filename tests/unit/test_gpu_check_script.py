"""``make gpu-check`` on a machine without GPUs: a CPU dry run of its plumbing, exit 0."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


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
    for step in ("nccl-ddp", "fsdp2-bf16", "calibrate", "bench-launch", "bench-teardown"):
        assert "skipped (no GPU)" in rows[step]
    assert "--bf16" in rows["fsdp2-bf16"] and "--nproc-per-node 1" in rows["nccl-ddp"]
    assert rows["plan"].split()[1] == "ok"
