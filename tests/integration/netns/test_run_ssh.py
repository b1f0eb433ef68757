"""`corral run` across testbed hosts over real SSH: training, faults, teardown, logs.

Each test runs the smallest world that shows its behaviour (two hosts where a third
adds nothing, standard-library ranks where torch is not the subject, the python
launcher where torchrun is not); the example trained under torchrun with two ranks
per host is the full-size case (marked slow).
"""

from __future__ import annotations

import re
import signal
import subprocess
import time
from pathlib import Path

import pytest

from corral.testbed import Testbed

from ..conftest import (
    REPO,
    SCRIPTS,
    corral_argv,
    job_processes,
    run_corral,
    wait_for_output,
    wait_no_job_processes,
)

pytestmark = pytest.mark.netns
EXAMPLE = str(REPO / "examples" / "train_ddp.py")


def _hostfile(tmp_path: Path, names: list[str], slots: int = 2) -> str:
    path = tmp_path / "hosts"
    path.write_text("".join(f"{n} slots={slots}\n" for n in names))
    return str(path)


def _cluster(testbed: Testbed, tmp_path: Path, names: list[str], slots: int = 2) -> list[str]:
    return ["--hosts", _hostfile(tmp_path, names, slots), "--ssh-config", str(testbed.ssh_config)]


def _run_args(
    testbed: Testbed, tmp_path: Path, run_dir: Path, job: str, names: list[str], slots: int = 2
) -> list[str]:
    return [
        "run",
        *_cluster(testbed, tmp_path, names, slots),
        "--run-dir",
        str(run_dir),
        "--job-id",
        job,
        "--grace",
        "5",
    ]


@pytest.mark.parametrize(
    ("launcher", "slots"),
    # torchrun with two ranks per host is the full-size case; the python launcher's
    # one rank per host shows the same across hosts with half the torch processes
    [pytest.param("torchrun", 2, marks=pytest.mark.slow), ("python", 1)],
    ids=["torchrun", "python"],
)
def test_example_across_two_hosts_trains_and_resumes(
    testbed: Testbed, launcher: str, slots: int, run_dir: Path, tmp_path: Path
) -> None:
    ckpt = tmp_path / "ckpt"  # a shared directory, as with NFS
    args = [
        *_run_args(testbed, tmp_path, run_dir, f"ssh-ddp-{launcher}", ["tb1", "tb2"], slots),
        "--launcher",
        launcher,
        "--master-port",
        "0",
        "--checkpoint-dir",
        str(ckpt),
    ]
    first = run_corral(*args, "--", EXAMPLE, "--steps", "30", cwd=tmp_path)
    assert first.returncode == 0, first.stderr[-4000:]
    m = re.search(r"final loss ([\d.]+) \(initial ([\d.]+)\)", first.stdout)
    assert m and float(m.group(1)) < float(m.group(2)) / 2
    for host in ("tb1", "tb2"):
        assert re.search(rf"^\[{host}:\d\] ", first.stdout, re.M), host
    assert "Master node tb1:" in first.stderr and "is ready for connections" in first.stderr
    args[args.index("--job-id") + 1] = f"ssh-ddp2-{launcher}"
    second = run_corral(*args, "--", EXAMPLE, "--steps", "40", cwd=tmp_path)
    assert second.returncode == 0, second.stderr[-4000:]
    assert "resumed from step 20" in second.stdout  # checkpoints every 20 steps
    assert not wait_no_job_processes(f"ssh-ddp2-{launcher}", within=30)


def test_hostnames_are_the_hosts_own(testbed: Testbed, run_dir: Path, tmp_path: Path) -> None:
    script = tmp_path / "who.py"
    script.write_text("import socket, os\nprint(socket.gethostname(), os.environ['NODE_RANK'])\n")
    result = run_corral(
        *_run_args(testbed, tmp_path, run_dir, "who", ["tb1", "tb2", "tb3"]),
        "--launcher",
        "python",
        "--nproc-per-node",
        "1",
        "--",
        str(script),
        cwd=tmp_path,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    for rank, host in enumerate(("tb1", "tb2", "tb3")):
        assert f"[{host}:{rank}] {host} {rank}" in result.stdout.splitlines()


def test_sigkilled_rank_on_host2_tears_down_every_host(
    healthy_testbed: Testbed, run_dir: Path, tmp_path: Path
) -> None:
    job = "ssh-kill"
    started = time.monotonic()
    result = run_corral(  # ranks 0, 1 on tb1 and 2, 3 on tb2
        *_run_args(healthy_testbed, tmp_path, run_dir, job, ["tb1", "tb2"]),
        "--launcher",
        "python",
        "--",
        str(SCRIPTS / "steps.py"),
        "--fail-rank",
        "2",
        "--mode",
        "kill",
        cwd=tmp_path,
    )
    assert result.returncode == 128 + 9, result.stderr[-3000:]
    assert "root cause: rank 2 on tb2 killed by SIGKILL" in result.stderr
    assert not wait_no_job_processes(job, within=30)
    assert time.monotonic() - started < 120
    for host in ("tb1", "tb2", "tb3"):  # and, asked on each host itself, nothing is left
        out = healthy_testbed.run_on(
            host,
            ["sh", "-c", f"grep -l CORRAL_JOB_ID={job} /proc/[0-9]*/environ 2>/dev/null || true"],
        )
        assert out.stdout.strip() == "", (host, out.stdout)


def test_sigkilled_corral_leaves_nothing_on_any_host(
    healthy_testbed: Testbed, run_dir: Path, tmp_path: Path
) -> None:
    job = "ssh-corral-killed"
    proc = subprocess.Popen(
        corral_argv(
            *_run_args(healthy_testbed, tmp_path, run_dir, job, ["tb1", "tb2"]),
            # the python launcher: what is left of torchrun's tree once corral is killed
            # is test_local_jobs' test_sigkilled_corral_leaves_nothing_behind[torchrun]
            # (the agents' teardown is the same over SSH), and each torchrun imports
            # torch (1.7 CPU-s a host; issue 30)
            "--launcher",
            "python",
            "--nproc-per-node",
            "1",
            "--",
            str(SCRIPTS / "steps.py"),
        ),
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    try:
        wait_for_output(proc, r"\[tb2:\d\] rank \d step 3")
        assert len(job_processes(job)) >= 2
        proc.kill()
        proc.wait(timeout=10)
    finally:
        proc.kill()
    assert not wait_no_job_processes(job, within=60)


def test_cut_link_is_reported_and_the_rest_torn_down(
    healthy_testbed: Testbed, run_dir: Path, tmp_path: Path
) -> None:
    job = "ssh-cut"
    proc = subprocess.Popen(
        corral_argv(
            *_run_args(healthy_testbed, tmp_path, run_dir, job, ["tb1", "tb2", "tb3"]),
            "--launcher",
            "python",
            "--",
            str(SCRIPTS / "steps.py"),
        ),
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        wait_for_output(proc, r"\[tb2:\d\] rank \d step 3")
        healthy_testbed.cut_link("tb2")
        cut_at = time.monotonic()
        _, err = proc.communicate(timeout=90)
        assert time.monotonic() - cut_at < 60
    finally:
        proc.kill()
        healthy_testbed.restore_link("tb2")
    assert proc.returncode == 255, err[-3000:]
    assert "lost host tb2" in err
    # the agent on tb2 lost corral's heartbeats and tore its ranks down by itself
    assert not wait_no_job_processes(job, within=60)
    # the link is back: the host-side logs hold what tb2 printed, including after the cut
    fetched = run_corral(
        "logs",
        job,
        "--from-hosts",
        "--host",
        "tb2",
        "--run-dir",
        str(run_dir),
        "--ssh-config",
        str(healthy_testbed.ssh_config),
        cwd=tmp_path,
    )
    assert fetched.returncode == 0, fetched.stderr
    host_steps = re.findall(r"^\[tb2:2\] rank 2 step (\d+)$", fetched.stdout, re.M)
    local_copy = (run_dir / job / "logs" / "tb2.2.log").read_text()
    coordinator_steps = re.findall(r"rank 2 step (\d+)", local_copy)
    assert host_steps and int(host_steps[-1]) > int(coordinator_steps[-1])


def test_problems_are_named_per_host_before_launch(
    healthy_testbed: Testbed, run_dir: Path, tmp_path: Path
) -> None:
    healthy_testbed.run_on("tb1", ["mkdir", "-p", "/srv/corral/code"])
    result = run_corral(
        *_run_args(healthy_testbed, tmp_path, run_dir, "wd", ["tb1", "tb2"]),
        "--workdir",
        "/srv/corral/code",
        "--",
        str(SCRIPTS / "steps.py"),
        cwd=tmp_path,
    )
    assert result.returncode == 2 and "Traceback" not in result.stderr
    # the pre-flight's code row names the host and the reason
    assert re.search(
        r"code:\s+fail\s+tb2\s+--workdir /srv/corral/code does not exist", result.stderr
    )
    assert "tb1: --workdir" not in result.stderr  # tb1 has it
    assert not (run_dir / "wd").exists()  # nothing was launched

    result = run_corral(
        *_run_args(healthy_testbed, tmp_path, run_dir, "py", ["tb1", "tb2"]),
        "--python",
        "/opt/nowhere/python",
        "--",
        str(SCRIPTS / "steps.py"),
        cwd=tmp_path,
    )
    assert result.returncode == 2
    # one row, both hosts named, the reason
    row = r"connectivity:\s+fail\s+tb1, tb2\s+no python interpreter found"
    assert re.search(row, result.stderr), result.stderr


def test_stopped_sshd_is_named_before_launch(
    healthy_testbed: Testbed, run_dir: Path, tmp_path: Path
) -> None:
    healthy_testbed.kill_sshd("tb3")
    try:
        result = run_corral(
            *_run_args(healthy_testbed, tmp_path, run_dir, "nosshd", ["tb1", "tb2", "tb3"]),
            "--",
            str(SCRIPTS / "steps.py"),
            cwd=tmp_path,
        )
    finally:
        healthy_testbed.start_sshd("tb3")
    assert result.returncode == 2, result.stderr
    assert "tb3" in result.stderr and "refused" in result.stderr
    assert not job_processes("nosshd")


def test_interrupt_over_ssh(healthy_testbed: Testbed, run_dir: Path, tmp_path: Path) -> None:
    job = "ssh-sigint"
    proc = subprocess.Popen(
        corral_argv(
            *_run_args(healthy_testbed, tmp_path, run_dir, job, ["tb1", "tb2"]),
            # the python launcher: torchrun's own teardown on a Ctrl-C is the subject of
            # test_local_jobs' test_sigint_to_corral_tears_down_once[torchrun], and each
            # torchrun imports torch (1.7 CPU-s a host; issue 30)
            "--launcher",
            "python",
            "--",
            str(SCRIPTS / "steps.py"),
        ),
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        wait_for_output(proc, r"\[tb2:\d\] rank \d step 3")
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert proc.returncode == 130, err[-3000:]
    assert not wait_no_job_processes(job, within=30)
