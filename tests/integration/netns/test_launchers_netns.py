"""The accelerate and command launchers and the plugin harness across two testbed
hosts over real SSH (2 hosts x 2 ranks, CPU): an unmodified Accelerate script, a
plugin under the harness, a command template's placeholders, and a failing rank
or command that fails the job with its code and leaves nothing on any host."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest

from corral.testbed import Testbed
from tests.conftest import require

from ..conftest import REPO, run_corral, wait_no_job_processes

pytestmark = [pytest.mark.netns, pytest.mark.torch]
EXAMPLE = str(REPO / "examples" / "accelerate_train.py")
PLUGIN = REPO / "examples" / "plugins" / "linear_trainer"


def _args(testbed: Testbed, tmp_path: Path, run_dir: Path, job: str, *more: str) -> list[str]:
    hosts = tmp_path / "hosts"
    hosts.write_text("tb1 slots=2\ntb2 slots=2\n")
    return [
        "run",
        "--hosts",
        str(hosts),
        "--ssh-config",
        str(testbed.ssh_config),
        "--run-dir",
        str(run_dir),
        "--job-id",
        job,
        "--master-port",
        "0",
        "--grace",
        "5",
        *more,
    ]


def test_unmodified_accelerate_script_trains_across_hosts(
    testbed: Testbed, run_dir: Path, tmp_path: Path
) -> None:
    require("accelerate")
    job = "acc-example"
    args = _args(testbed, tmp_path, run_dir, job, "--launcher", "accelerate")
    result = run_corral(*args, "--", EXAMPLE, cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-4000:] + result.stdout[-2000:]
    for host, rank in (("tb1", 0), ("tb1", 1), ("tb2", 2), ("tb2", 3)):
        assert f"[{host}:{rank}] process {rank} of 4 (MULTI_CPU)" in result.stdout
    # 256 examples x 3 epochs split over 4 processes on 2 hosts: one data-parallel group
    assert "[tb1:0] examples per process: [192, 192, 192, 192], total 768" in result.stdout
    assert "[tb2:2] examples per process: [192, 192, 192, 192], total 768" in result.stdout
    assert not wait_no_job_processes(job, within=30)


def test_plugin_under_the_harness_sees_the_adjusted_config_and_accelerator(
    testbed: Testbed, run_dir: Path, tmp_path: Path
) -> None:
    require("accelerate")
    plugin = tmp_path / "linear_trainer"  # unmodified, in a directory every host sees
    shutil.copytree(PLUGIN, plugin)
    job = "harness-plugin"
    args = _args(testbed, tmp_path, run_dir, job, "--harness", "--workdir", str(tmp_path))
    result = run_corral(
        *args, "--", str(plugin), "--config_file", str(plugin / "config.json"), cwd=tmp_path
    )
    assert result.returncode == 0, result.stderr[-4000:] + result.stdout[-2000:]
    # config.json: batch_size 64, learning_rate 0.05 -> 64 / 4 ranks, 0.05 x 4
    for host, rank in (("tb1", 0), ("tb1", 1), ("tb2", 2), ("tb2", 3)):
        out_dir = "outputs/linear_trainer" + (f"/rank-{rank}" if rank else "")
        assert (
            f"[{host}:{rank}] plugin: rank {rank}/4 batch_size=16 learning_rate=0.2 "
            f"output_dir={out_dir} steps/epoch=4"
        ) in result.stdout
        assert re.search(
            rf"^\[{host}:{rank}\] corral harness: rank {rank}/4 \(MULTI_CPU\), config "
            rf"\S+/{host}/harness/attempt-0-rank-{rank}\.json$",
            result.stdout,
            re.M,
        )
    assert "[tb1:0] plugin: saved to outputs/linear_trainer" in result.stdout
    assert (tmp_path / "outputs" / "linear_trainer" / "result.json").is_file()
    assert not wait_no_job_processes(job, within=30)


def test_command_template_prints_its_placeholders(
    testbed: Testbed, run_dir: Path, tmp_path: Path
) -> None:
    job = "command-placeholders"
    template = (
        "echo node_rank={node_rank} nnodes={nnodes} nproc_per_node={nproc_per_node} "
        "world_size={world_size} master={master_addr}:{master_port} host={host} "
        "job_id={job_id} NODE_RANK=$NODE_RANK on $(hostname)"
    )
    args = _args(
        testbed, tmp_path, run_dir, job, "--launcher", "command", "--command-template", template
    )
    result = run_corral(*args, cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-4000:]
    port = re.search(r"master=tb1:(\d+) ", result.stdout)
    assert port, result.stdout
    for node, host in enumerate(("tb1", "tb2")):
        assert (
            f"[{host}] node_rank={node} nnodes=2 nproc_per_node=2 world_size=4 "
            f"master=tb1:{port.group(1)} host={host} job_id={job} NODE_RANK={node} on {host}"
        ) in result.stdout.splitlines()


def test_failing_accelerate_rank_fails_the_job_and_leaves_nothing(
    healthy_testbed: Testbed, run_dir: Path, tmp_path: Path
) -> None:
    require("accelerate")
    script = tmp_path / "fails.py"
    script.write_text(
        "import sys, time\n"
        "from accelerate import Accelerator\n"
        "acc = Accelerator()\n"
        "acc.wait_for_everyone()\n"
        "print('joined', acc.process_index, acc.num_processes, flush=True)\n"
        "if acc.process_index == 2:\n"
        "    time.sleep(0.5)\n"
        "    sys.exit(7)\n"
        "time.sleep(600)  # the others are still running: corral stops them\n"
    )
    job = "acc-fails"
    args = _args(healthy_testbed, tmp_path, run_dir, job, "--launcher", "accelerate")
    result = run_corral(*args, "--", str(script), cwd=tmp_path)
    assert result.returncode == 7, result.stderr[-4000:]
    assert "[tb2:2] joined 2 4" in result.stdout
    assert "root cause: rank 2 on tb2 exited with code 7" in result.stderr
    assert not wait_no_job_processes(job, within=30)


def test_failing_command_fails_the_job_and_leaves_nothing(
    healthy_testbed: Testbed, run_dir: Path, tmp_path: Path
) -> None:
    job = "command-fails"
    template = "if [ {node_rank} = 1 ]; then sleep 1; exit 9; fi; sleep 600; echo not reached"
    args = _args(
        healthy_testbed,
        tmp_path,
        run_dir,
        job,
        "--launcher",
        "command",
        "--command-template",
        template,
    )
    result = run_corral(*args, cwd=tmp_path)
    assert result.returncode == 9, result.stderr[-4000:]
    assert "root cause: the launcher on tb2 exited with code 9" in result.stderr
    assert "not reached" not in result.stdout
    assert not wait_no_job_processes(job, within=30)  # tb1's bash and sleep included
