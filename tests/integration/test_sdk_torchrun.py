"""The SDK and examples/train_ddp.py under real torch.distributed (gloo on CPU), no corral."""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
import threading
from pathlib import Path

import pytest

pytestmark = pytest.mark.torch

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "train_ddp.py"
TIMEOUT = 180
FINAL = re.compile(r"^final loss (\d+\.\d{4}) \(initial (\d+\.\d{4})\)$", re.MULTILINE)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def clean_env(**extra: str) -> dict[str, str]:
    """This environment without any launcher/corral variables that would leak in."""
    drop = {"RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "NODE_RANK", "NNODES"}
    drop |= {"MASTER_ADDR", "MASTER_PORT", "GROUP_RANK", "GROUP_WORLD_SIZE"}
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in drop and not k.startswith(("CORRAL_", "TORCHELASTIC_"))
    }
    env.update(OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1", **extra)
    return env


def torchrun(
    tmp_path: Path, *args: str, nproc: int = 2, port: int | None = None
) -> tuple[subprocess.CompletedProcess[str], int]:
    port = port or free_port()
    cmd = [
        sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(nproc),
        "--master-port", str(port), str(EXAMPLE), *args,
    ]  # fmt: skip
    proc = subprocess.run(
        cmd, cwd=tmp_path, env=clean_env(), capture_output=True, text=True, timeout=TIMEOUT
    )
    return proc, port


def final_losses(output: str) -> tuple[float, float]:
    match = FINAL.search(output)
    assert match, output
    return float(match.group(1)), float(match.group(2))


def test_torchrun_trains_checkpoints_and_resumes(tmp_path: Path) -> None:
    proc, port = torchrun(
        tmp_path, "--steps", "30", "--checkpoint-dir", "tmp", "--checkpoint-every", "10"
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out
    final, initial = final_losses(proc.stdout)
    assert final < initial / 2, (final, initial)
    assert sorted(p.name for p in (tmp_path / "tmp").iterdir()) == [
        "ckpt-00000010.pt",
        "ckpt-00000020.pt",
        "ckpt-00000030.pt",
    ]
    assert "resumed from step" not in proc.stdout
    # init_distributed's log: rank 1 waits for the master, rank 0 hosts it.
    assert f"Waiting for master 127.0.0.1:{port}..." in proc.stderr
    assert f"Master node 127.0.0.1:{port} is ready for connections" in proc.stderr
    for rank in (0, 1):
        assert (
            f"Initializing distributed process group: rank={rank}, world_size=2, timeout=0:05:00"
            in proc.stderr
        )
    assert proc.stdout.count("[corral] rank ") == 2  # print_distributed_info, once per rank

    proc2, _ = torchrun(
        tmp_path, "--steps", "50", "--checkpoint-dir", "tmp", "--checkpoint-every", "10"
    )
    assert proc2.returncode == 0, proc2.stdout + proc2.stderr
    assert "resumed from step 30" in proc2.stdout
    assert "step 31/50" in proc2.stdout
    assert "step 30/50" not in proc2.stdout
    final2, initial2 = final_losses(proc2.stdout)
    assert initial2 == initial  # carried in the checkpoint
    assert final2 < initial / 2
    assert sorted(p.name for p in (tmp_path / "tmp").iterdir()) == [
        "ckpt-00000030.pt",
        "ckpt-00000040.pt",
        "ckpt-00000050.pt",
    ]


def test_injected_exception_reaches_torchrun_summary(tmp_path: Path) -> None:
    """@record writes torchrun's error file, so torchrun names the real root cause."""
    proc, _ = torchrun(
        tmp_path, "--steps", "30", "--checkpoint-dir", "ck", "--checkpoint-every", "5",
        "--fail-at-step", "8", "--fail-rank", "1", "--fail-mode", "raise",
    )  # fmt: skip
    assert proc.returncode == 1, proc.stderr  # torchrun's own code when a worker fails
    summary = proc.stderr[proc.stderr.index("Root Cause") :]
    assert "rank      : 1" in summary
    assert "exitcode  : 1 (pid: " in summary  # the uncaught exception's exit code
    assert "injected failure at step 8 on rank 1" in summary
    assert sorted(p.name for p in (tmp_path / "ck").iterdir()) == ["ckpt-00000005.pt"]


def test_injected_exit_code(tmp_path: Path) -> None:
    # one rank: the exit code is the subject (the root cause among two ranks is the
    # test above), and each rank imports torch
    proc, _ = torchrun(
        tmp_path, "--steps", "30", "--checkpoint-every", "0",
        "--fail-at-step", "3", "--fail-rank", "0", "--exit-code", "7", nproc=1,
    )  # fmt: skip
    assert proc.returncode == 1, proc.stderr  # torchrun's own code, whatever the worker's
    summary = proc.stderr[proc.stderr.index("Root Cause") :]
    assert "rank      : 0" in summary
    assert "exitcode  : 7 (pid: " in summary
    assert "exited with code 7" in summary


def test_plain_python_single_process(tmp_path: Path) -> None:
    proc = subprocess.run(
        [
            sys.executable,
            str(EXAMPLE),
            "--steps",
            "40",
            "--checkpoint-every",
            "20",
            "--checkpoint-dir",
            "checkpoints",
        ],
        cwd=tmp_path,
        env=clean_env(),
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    final, initial = final_losses(proc.stdout)
    assert final < initial / 2
    assert "Initializing distributed process group" not in proc.stderr
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == [
        "ckpt-00000020.pt",
        "ckpt-00000040.pt",
    ]


WORKER = """
import torch, torch.distributed as dist
from corral import sdk
assert sdk.init_distributed(timeout=60, master_timeout=60) is True
t = torch.tensor([float(sdk.info().rank + 1)])
dist.all_reduce(t)
sdk.barrier()
print("sum", int(t.item()), flush=True)
sdk.cleanup()
"""


def test_rank_waits_for_a_late_master(tmp_path: Path) -> None:
    """Rank 1 starts first, waits for rank 0's store, then both really talk (gloo)."""
    port = free_port()

    def start(rank: int) -> subprocess.Popen[str]:
        env = clean_env(
            RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE="2", LOCAL_WORLD_SIZE="2",
            MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port),
        )  # fmt: skip
        return subprocess.Popen(
            [sys.executable, "-c", WORKER],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )

    late = start(1)
    assert late.stderr is not None and late.stdout is not None
    late_err: list[str] = []
    waiting = threading.Event()  # set by rank 1's "Waiting for master" line (or its EOF)

    def read_late_stderr() -> None:  # until EOF, so the pipe never fills
        for line in late.stderr:  # type: ignore[union-attr]
            late_err.append(line)
            if line.startswith("Waiting for master"):
                waiting.set()
        waiting.set()

    reader = threading.Thread(target=read_late_stderr, daemon=True)
    reader.start()
    master: subprocess.Popen[str] | None = None
    try:
        waiting.wait(TIMEOUT)
        assert any(line.startswith("Waiting for master") for line in late_err), (
            f"rank 1 did not say it waits for the master (exit {late.poll()}): {late_err}"
        )
        assert late.poll() is None, "".join(late_err)  # still waiting: the master is late
        master = start(0)
        out0, err0 = master.communicate(timeout=TIMEOUT)
        late.wait(timeout=TIMEOUT)
        out1 = late.stdout.read()
        reader.join(TIMEOUT)
        assert not reader.is_alive(), "rank 1's stderr did not reach EOF"
    finally:
        for p in (late, master):
            if p is not None and p.poll() is None:
                p.kill()
                p.wait()
    err1 = "".join(late_err)
    assert late.returncode == 0, err1
    assert master.returncode == 0, err0
    assert out0.split() == out1.split() == ["sum", "3"]
    lines = [line for line in err1.splitlines() if not line.startswith("[W")]
    assert lines[:3] == [
        f"Waiting for master 127.0.0.1:{port}...",
        f"Master node 127.0.0.1:{port} is ready for connections",
        "Initializing distributed process group: rank=1, world_size=2, timeout=0:01:00",
    ]
    assert "Waiting for master" not in err0


def test_master_never_comes_up(tmp_path: Path) -> None:
    env = clean_env(RANK="1", WORLD_SIZE="2", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()))
    code = "from corral import sdk\nsdk.init_distributed(master_timeout=1.0)\n"
    proc = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=TIMEOUT
    )
    assert proc.returncode == 1
    assert "MasterNotReadyError" in proc.stderr
    assert "did not accept connections within 1s" in proc.stderr
