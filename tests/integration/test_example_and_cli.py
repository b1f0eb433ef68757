"""The DDP example under corral, `corral plan`, and bad input at the command line."""

from __future__ import annotations

import json
import re
import socket
from pathlib import Path

import pytest

from tests.conftest import require_torch

from .conftest import REPO, SCRIPTS, run_corral, wait_no_job_processes

EXAMPLE = str(REPO / "examples" / "train_ddp.py")


def _losses(text: str) -> tuple[float, float]:
    m = re.search(r"final loss ([\d.]+) \(initial ([\d.]+)\)", text)
    assert m, text[-3000:]
    return float(m.group(1)), float(m.group(2))


@pytest.mark.torch
# torchrun here; the python launcher's train-then-resume runs over SSH in
# netns/test_run_ssh.py::test_example_across_two_hosts_trains_and_resumes[python]
@pytest.mark.parametrize("launcher", ["torchrun"])
def test_ddp_example_trains_then_resumes(launcher: str, run_dir: Path, tmp_path: Path) -> None:
    require_torch()
    ckpt = tmp_path / "ckpt"
    common = [
        "run",
        "--hosts",
        "local:2",
        "--nproc-per-node",
        "1",  # the smallest world across nodes: 2 torchruns and 2 ranks, not 4
        "--master-port",
        "0",
        "--run-dir",
        str(run_dir),
        "--checkpoint-dir",
        str(ckpt),
    ]
    first = run_corral(
        *common, "--launcher", launcher, "--job-id", f"ddp1-{launcher}",
        *("--", EXAMPLE, "--steps", "40"), cwd=tmp_path,
    )  # fmt: skip
    assert first.returncode == 0, first.stderr[-3000:]
    final, initial = _losses(first.stdout)
    assert final < initial / 2, (final, initial)
    assert "succeeded" in first.stderr
    assert re.search(r"local-0 .* step 40/40 loss=", first.stderr)  # progress reached the summary
    assert sorted(p.name for p in ckpt.glob("ckpt-*.pt")) == [
        "ckpt-00000020.pt",
        "ckpt-00000040.pt",
    ]
    # the resume under the python launcher: the example's resume is the subject (the
    # same under any launcher; torchrun's own resume is test_sdk_torchrun's), and a
    # torchrun per node imports torch once more
    second = run_corral(
        *common, "--launcher", "python", "--job-id", f"ddp2-{launcher}",
        *("--", EXAMPLE, "--steps", "60"), cwd=tmp_path,
    )  # fmt: skip
    assert second.returncode == 0, second.stderr[-3000:]
    assert "resumed from step 40" in second.stdout
    assert (ckpt / "ckpt-00000060.pt").exists()
    assert not wait_no_job_processes(f"ddp2-{launcher}", within=10)
    # the same run again: its checkpoint is already at --steps, and it says so (rank 0,
    # once); the python launcher, as above
    third = run_corral(
        *common, "--launcher", "python", "--job-id", f"ddp3-{launcher}",
        *("--", EXAMPLE, "--steps", "60"), cwd=tmp_path,
    )  # fmt: skip
    assert third.returncode == 0, third.stderr[-3000:]
    assert third.stdout.count("already complete at step 60/60; nothing to do (delete ") == 1
    assert f"delete {ckpt} or pass --checkpoint-dir elsewhere to start fresh)" in third.stdout
    assert not re.search(r"step \d+/60 loss", third.stdout)  # trained nothing
    assert "final loss" not in third.stdout


@pytest.mark.torch
def test_ddp_example_without_checkpoint_dir_writes_nothing_in_cwd(tmp_path: Path) -> None:
    require_torch()
    work = tmp_path / "work"
    work.mkdir()
    result = run_corral(
        "run",
        "--hosts",
        "local:1",
        "--nproc-per-node",
        "2",
        "--master-port",
        "0",
        "--launcher",
        "python",
        "--run-dir",
        str(tmp_path / "runs"),
        "--",
        EXAMPLE,
        "--steps",
        "20",
        "--checkpoint-every",
        "10",
        cwd=work,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert sorted(p.name for p in work.iterdir()) == []  # no ./checkpoints in the code tree
    assert "step 20/20 loss" in result.stdout
    assert result.stdout.count("checkpoints off") == 1


def test_plan_json_is_the_exact_command(tmp_path: Path) -> None:
    result = run_corral(
        "plan",
        "--hosts",
        "local:2",
        "--nproc-per-node",
        "2",
        "--job-id",
        "p1",
        "--launcher",
        "python",
        "--env",
        "A=1",
        "--json",
        "--",
        str(SCRIPTS / "steps.py"),
        "x y",
        cwd=tmp_path,
    )
    assert result.returncode == 0, result.stderr
    doc = json.loads(result.stdout)
    assert doc["job_id"] == "p1" and doc["launcher"] == "python"
    node = doc["nodes"][1]
    assert node["host"] == "local-1" and node["nproc"] == 2
    assert node["argv"][-2:] == [str(SCRIPTS / "steps.py"), "x y"]
    assert [r["rank"] for r in node["ranks"]] == [2, 3]
    assert node["env"]["A"] == "1" and node["env"]["WORLD_SIZE"] == "4"
    assert not (tmp_path / "runs").exists()  # a dry run writes nothing


def test_plan_table(tmp_path: Path) -> None:
    result = run_corral("plan", "--hosts", "local:2", "--", str(SCRIPTS / "steps.py"), cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert "torch.distributed.run" in result.stdout and "--rdzv-backend=c10d" in result.stdout
    assert "MASTER_ADDR=127.0.0.1" in result.stdout


def _bad(tmp_path: Path, *args: str) -> str:
    result = run_corral(*args, cwd=tmp_path, timeout=60)
    assert result.returncode == 2, (result.returncode, result.stdout, result.stderr)
    assert "Traceback" not in result.stderr
    return result.stderr


def test_missing_script(tmp_path: Path) -> None:
    err = _bad(tmp_path, "run", "--hosts", "local:2", "--", "nope.py")
    assert "script nope.py not found" in err


def test_no_script(tmp_path: Path) -> None:
    assert "no script given" in _bad(tmp_path, "run", "--hosts", "local:2")


def test_no_hosts(tmp_path: Path) -> None:
    assert "--hosts" in _bad(tmp_path, "run", "--", str(SCRIPTS / "steps.py"))


def test_malformed_hostfile_names_file_and_line(tmp_path: Path) -> None:
    hostfile = tmp_path / "hosts"
    hostfile.write_text("# nodes\nnode1:4\nnode2 slots=zero\n")
    err = _bad(tmp_path, "run", "--hosts", str(hostfile), "--", "train.py")
    assert f"{hostfile}:3:" in err and "slots" in err


def test_duplicate_host(tmp_path: Path) -> None:
    hostfile = tmp_path / "hosts"
    hostfile.write_text("node1\nnode1:2\n")
    err = _bad(tmp_path, "run", "--hosts", str(hostfile), "--", "train.py")
    assert f"{hostfile}:2:" in err and "duplicate" in err.lower()


def test_zero_procs_per_node(tmp_path: Path) -> None:
    err = _bad(
        tmp_path,
        "run",
        "--hosts",
        "local:2",
        "--nproc-per-node",
        "0",
        "--",
        str(SCRIPTS / "steps.py"),
    )
    assert "--nproc-per-node" in err and "at least 1" in err


def test_unknown_launcher(tmp_path: Path) -> None:
    err = _bad(
        tmp_path,
        "run",
        "--hosts",
        "local:2",
        "--launcher",
        "mpirun",
        "--",
        str(SCRIPTS / "steps.py"),
    )
    assert "unknown launcher 'mpirun'" in err


def test_env_without_equals(tmp_path: Path) -> None:
    err = _bad(
        tmp_path, "run", "--hosts", "local:1", "--env", "FOO", "--", str(SCRIPTS / "steps.py")
    )
    # a bare KEY forwards this shell's value; an unset one is named
    assert "--env" in err and "FOO is not set here (give KEY=VALUE" in err


def test_master_port_taken(tmp_path: Path) -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        err = _bad(
            tmp_path,
            "run",
            "--hosts",
            "local:2",
            "--master-port",
            str(port),
            "--",
            str(SCRIPTS / "steps.py"),
        )
    assert f"master port {port}" in err and "already in use" in err


def test_verbose_shows_details(tmp_path: Path) -> None:
    result = run_corral("-v", "run", "--hosts", "local:2", "--", "nope.py", cwd=tmp_path)
    assert result.returncode == 2
    assert "Traceback" in result.stderr and "script nope.py not found" in result.stderr
