"""``corral slurm render|submit``: golden sbatch scripts (CPU and GPU), every render valid
bash (``bash -n``), secrets never written into the script, bad input as one clear error,
and submit without sbatch as one line without a traceback."""

from __future__ import annotations

import dataclasses
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from corral.cli import main as cli_main
from corral.cli.main import _register, app
from corral.errors import ConfigError
from corral.slurm.render import (
    MASTER_NOT_READY_EXIT,
    SlurmJob,
    checkpoint_grace,
    render_slurm,
    sbatch_argv,
)

_register()
GOLDEN = Path(__file__).parent / "golden" / "slurm"
BASH = shutil.which("bash") or "/bin/bash"


def _job(**kw: Any) -> SlurmJob:
    base: dict[str, Any] = dict(
        script="train.py",
        args=("--epochs", "3", "--name", "it's $HOME `x`", "multi\nline"),
        nodes=2,
        python="/opt/venv/bin/python",
        env={"WANDB_MODE": "offline"},
    )
    base.update(kw)
    return SlurmJob(**base)


CASES: dict[str, SlurmJob] = {
    "cpu": _job(
        nproc_per_node=2,
        partition="cpu",
        time="01:30:00",
        checkpoint_dir="/shared/ckpt/run 1",
        max_restarts=2,
        forward_env=("HF_TOKEN", "DB_URL"),
    ),
    "gpu": _job(
        nodes=4,
        gpus_per_node=8,
        cpus_per_task=64,
        partition="gpu,gpu-long",
        account="ml-team",
        time="2-00:00:00",
        job_name="llm.pretrain",
        workdir="/shared/code",
        output_dir="/shared/logs",
        master_port=0,
        nccl_interface="ib0",
        gloo_interface="eth0",
        rdzv_timeout=900.0,
        dist_timeout=3600.0,
        checkpoint_dir="/shared/ckpt",
        max_restarts=3,
        sbatch_options=("--mem=0", "--exclusive"),
    ),
}
# more renders for the syntax check: defaults, odd interpreter paths, no env at all
EXTRA: dict[str, SlurmJob] = {
    "defaults": SlurmJob(script="t.py"),
    "odd_python": _job(python="/opt/my env/bin/python3", rdzv_timeout=12.5, env={}),
    "forward_only": _job(env={}, forward_env=("SECRET_THING",), secret_env=("SECRET_THING",)),
}


def _bash_n(text: str, tmp_path: Path) -> list[str]:
    """``bash -n`` of the script and of the node step it hands to srun as a string
    (which the script's own check does not parse): the errors, empty when both parse."""
    step = text[text.index("<<'CORRAL_NODE'\n") + 15 : text.index("\nCORRAL_NODE\n")]
    errors = []
    for name, body in (("job.sbatch", text), ("node-step.sh", step)):
        path = tmp_path / name
        path.write_text(body)
        done = subprocess.run([BASH, "-n", str(path)], capture_output=True, text=True)
        errors += [f"{name}: {line}" for line in done.stderr.splitlines()]
        if done.returncode != 0 and not done.stderr:
            errors.append(f"{name}: bash -n exit {done.returncode}")
    return errors


@pytest.mark.parametrize("case", sorted(CASES))
def test_render_matches_golden(case: str) -> None:
    text = render_slurm(CASES[case])
    path = GOLDEN / f"{case}.sbatch"
    if os.environ.get("CORRAL_UPDATE_GOLDEN") == "1":
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    assert text == path.read_text()


@pytest.mark.parametrize("case", sorted({**CASES, **EXTRA}))
def test_every_render_is_valid_bash(case: str, tmp_path: Path) -> None:
    assert _bash_n(render_slurm({**CASES, **EXTRA}[case]), tmp_path) == []


@pytest.mark.parametrize("which", ["node-step.sh", "job.sbatch"])
def test_the_syntax_check_can_fail(which: str, tmp_path: Path) -> None:
    """A ``fi`` dropped from the node step (the first one) or from the script itself
    (the last one) is caught, and blamed on that part."""
    text = render_slurm(CASES["cpu"])
    if which == "node-step.sh":
        broken = text.replace("\nfi\n", "\n", 1)
    else:
        head, _, tail = text.rpartition("\nfi\n")
        broken = f"{head}\n{tail}"
    errors = _bash_n(broken, tmp_path)
    assert errors and all(e.startswith(which) for e in errors), errors


def test_the_script_args_survive_bash_quoting(tmp_path: Path) -> None:
    """The TRAIN array the script passes to every node holds SCRIPT ARGS exactly."""
    job = CASES["cpu"]
    text = render_slurm(job)
    start = text.index("\nTRAIN=(") + 1
    literal = text[start : text.index("\nMAX_RESTARTS=", start)]
    out = subprocess.run(
        [BASH, "-c", literal + '\nprintf "%s\\0" "${TRAIN[@]}"'], capture_output=True, text=True
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.split("\0")[:-1] == [job.script, *job.args]


def test_header_and_rendezvous() -> None:
    text = render_slurm(CASES["gpu"])
    header = [x for x in text.splitlines() if x.startswith("#SBATCH ")]
    assert header == [
        "#SBATCH --job-name=llm.pretrain",
        "#SBATCH --nodes=4",
        "#SBATCH --ntasks-per-node=1",
        "#SBATCH --cpus-per-task=64",
        "#SBATCH --gpus-per-node=8",
        "#SBATCH --partition=gpu,gpu-long",
        "#SBATCH --account=ml-team",
        "#SBATCH --time=2-00:00:00",
        "#SBATCH --chdir=/shared/code",
        "#SBATCH --signal=B:USR1@120",  # the checkpoint request before the time limit
        "#SBATCH --requeue",
        "#SBATCH --open-mode=append",
        "#SBATCH --output=/shared/logs/%x-%j.out",
        "#SBATCH --error=/shared/logs/%x-%j.err",
        "#SBATCH --mem=0",
        "#SBATCH --exclusive",
    ]
    assert 'scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n1' in text
    assert 'export NODE_RANK="$SLURM_NODEID"' in text
    assert 'export CORRAL_ATTEMPT="${SLURM_RESTART_COUNT:-0}"' in text
    assert "export CORRAL_CHECKPOINT_DIR=/shared/ckpt" in text
    assert "--rdzv-backend=c10d" in text and "join_timeout=${CORRAL_RDZV_TIMEOUT}" in text
    assert "export CORRAL_RDZV_TIMEOUT=900" in text and "export CORRAL_DIST_TIMEOUT=3600" in text
    assert "export NCCL_SOCKET_IFNAME=ib0" in text and "export GLOO_SOCKET_IFNAME=eth0" in text
    assert 'export MASTER_PORT="$(( 20000 + SLURM_JOB_ID % 40000 ))"' in text
    assert f"exit {MASTER_NOT_READY_EXIT}" in text
    assert "--nproc-per-node=8" in text and "--gpus-per-node=8 \\" in text  # srun too


def test_cpu_defaults_one_rank_and_one_cpu_per_rank() -> None:
    text = render_slurm(SlurmJob(script="t.py", nodes=3, nproc_per_node=4))
    assert "#SBATCH --cpus-per-task=4" in text and "--nproc-per-node=4" in text
    assert "gpus" not in text
    assert "CORRAL_CHECKPOINT_DIR" not in text and "MAX_RESTARTS=0" in text
    assert "#SBATCH --output=%x-%j.out" in text


def test_secrets_are_forwarded_never_written() -> None:
    job = CASES["cpu"]
    text = render_slurm(job)
    for key in ("HF_TOKEN", "DB_URL"):
        assert f"export {key}=" not in text
        assert f'"${{{key}:?{key} was not forwarded' in text
    assert sbatch_argv(job, "/r/job.sbatch") == [
        "sbatch",
        "--parsable",
        "--export=HF_TOKEN,DB_URL",
        "/r/job.sbatch",
    ]
    assert sbatch_argv(CASES["gpu"], "j")[2] == "--export=NONE"


@pytest.mark.parametrize(
    ("changes", "option", "words"),
    [
        ({"env": {"HF_TOKEN": "hf_abc"}}, "--env", "HF_TOKEN is secret"),
        ({"env": {"DB_URL": "x"}, "secret_env": ("DB_URL",)}, "--env", "DB_URL is secret"),
        ({"env": {"MASTER_ADDR": "x"}}, "--env", "set by corral"),
        ({"forward_env": ("1BAD",)}, "--env", "not a valid environment variable"),
        ({"env": {"A": "1"}, "forward_env": ("A",)}, "--env", "both bare and with a value"),
        ({"nodes": 0}, "--nodes", "at least 1"),
        ({"gpus_per_node": -1}, "--gpus-per-node", "at least 0"),
        ({"nproc_per_node": 0}, "--nproc-per-node", "at least 1"),
        ({"cpus_per_task": 0}, "--cpus-per-task", "at least 1"),
        ({"max_restarts": -1}, "--max-restarts", "at least 0"),
        ({"time": "1h"}, "--time", "not a Slurm time limit"),
        ({"partition": "gpu queue"}, "--partition", "not a Slurm name"),
        ({"account": "a;b"}, "--account", "not a Slurm name"),
        ({"job_name": "x/y"}, "--job-name", "not a Slurm name"),
        ({"workdir": "/my code"}, "--workdir", "#SBATCH line"),
        ({"output_dir": "/my logs"}, "--output-dir", "#SBATCH line"),
        ({"sbatch_options": ("mem=1G",)}, "--sbatch-option", "not an sbatch option"),
        ({"sbatch_options": ("--mem=1G\nrm -rf /",)}, "--sbatch-option", "not an sbatch option"),
        ({"master_port": 70000}, "--master-port", "not a TCP port"),
        ({"rdzv_timeout": 0.0}, "--rdzv-timeout", "must be positive"),
        ({"dist_timeout": -1.0}, "--dist-timeout", "must be positive"),
        ({"python": " "}, "--python", "cannot name an interpreter"),
    ],
)
def test_bad_input_names_the_option(changes: dict[str, Any], option: str, words: str) -> None:
    with pytest.raises(ConfigError) as caught:
        render_slurm(_job(**changes))
    assert caught.value.option == option
    assert words in str(caught.value)


@pytest.mark.parametrize("time", ["90", "90:00", "01:30:00", "2-00", "2-12:00", "2-12:00:00"])
def test_every_slurm_time_form_is_accepted(time: str) -> None:
    assert f"#SBATCH --time={time}" in render_slurm(_job(time=time))


def _main(monkeypatch: pytest.MonkeyPatch, *args: str) -> int:
    monkeypatch.setattr(sys, "argv", ["corral", "slurm", *args])
    with pytest.raises(SystemExit) as exited:
        cli_main.main()
    return int(exited.value.code or 0)


CPU_ARGS = (
    "--nodes", "2", "--nproc-per-node", "2", "--partition", "cpu", "--time", "01:30:00",
    "--python", "/opt/venv/bin/python", "--env", "WANDB_MODE=offline", "--env", "HF_TOKEN",
    "--env", "DB_URL", "--checkpoint-dir", "/shared/ckpt/run 1", "--max-restarts", "2",
    "--master-port", "29500",
    "--", "train.py", "--epochs", "3", "--name", "it's $HOME `x`", "multi\nline",
)  # fmt: skip


def test_cli_render_prints_the_golden_script() -> None:
    result = CliRunner().invoke(app, ["slurm", "render", *CPU_ARGS])
    assert result.exit_code == 0, result.output
    assert result.stdout == (GOLDEN / "cpu.sbatch").read_text()


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (
            ("--nodes", "2", "--env", "API_TOKEN=abc", "--", "t.py"),
            "error: --env: API_TOKEN is secret: its value would be written into the batch "
            "script. Give it bare (--env API_TOKEN): corral slurm submit forwards it from "
            "this shell's environment with sbatch --export",
        ),
        (
            ("--nodes", "2", "--launcher", "python", "--", "t.py"),
            "error: --launcher: launcher 'python' is not available on Slurm: each node runs "
            "torchrun",
        ),
        (
            ("--nodes", "2", "--nproc-per-node", "many", "--", "t.py"),
            "error: --nproc-per-node: 'many' is not a number or 'auto'",
        ),
        (
            ("--nodes", "2"),
            "error: no script given: corral slurm render [OPTIONS] -- SCRIPT [ARGS...]",
        ),
    ],
)
def test_cli_errors_are_one_line(
    args: tuple[str, ...],
    message: str,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert _main(monkeypatch, "render", *args) == 2
    captured = capsys.readouterr()
    assert captured.err.strip().splitlines() == [message] and not captured.out


def test_submit_without_sbatch_is_one_line(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    monkeypatch.setenv("PATH", str(tmp_path / "empty-bin"))
    monkeypatch.setenv("HF_TOKEN", "hf_secret_value")
    args = ("--nodes", "2", "--env", "HF_TOKEN", "--run-dir", str(tmp_path / "runs"), "--", "t.py")
    assert _main(monkeypatch, "submit", *args) == 2
    captured = capsys.readouterr()
    assert captured.err.strip().splitlines() == [
        "error: sbatch not found on PATH: run this on a Slurm login node (or install Slurm's "
        "client, Debian: slurm-client), or print the script with corral slurm render"
    ]
    assert "Traceback" not in captured.err and not captured.out
    assert not (tmp_path / "runs").exists()  # nothing written for a job never submitted


def test_submit_needs_the_bare_env_keys_set_here(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    monkeypatch.delenv("CORRAL_UNSET_TOKEN", raising=False)
    args = ("--nodes", "1", "--env", "CORRAL_UNSET_TOKEN", "--run-dir", str(tmp_path), "--", "t.py")
    assert _main(monkeypatch, "submit", *args) == 2
    assert capsys.readouterr().err.strip().splitlines() == [
        "error: --env: CORRAL_UNSET_TOKEN not set here: a bare --env K forwards this shell's value"
    ]


# --- the time limit: checkpoint request, requeue; dry run; launchers ------------------


def test_the_time_limit_signal_asks_for_a_checkpoint_and_requeues() -> None:
    text = render_slurm(_job(time="04:00:00", max_restarts=2, signal_lead=300))
    assert "#SBATCH --signal=B:USR1@300" in text
    assert "trap on_time_limit USR1" in text
    assert 'scancel --signal=USR2 "$SLURM_JOB_ID"' in text  # the steps, not the batch shell
    assert "trap '' USR2" in text  # torchrun and the node scripts ignore it
    assert f"for _ in $(seq {checkpoint_grace(300)}); do" in text
    assert 'requeue "time limit in 30s or less"' in text
    assert checkpoint_grace(300) == 270 and checkpoint_grace(20) == 10
    assert 'bash -c "$NODE_STEP" corral-node "${TRAIN[@]}" &' in text
    never = render_slurm(_job(signal_lead=0))
    assert "--signal" not in never and "on_time_limit" not in never


def test_a_bad_signal_lead_names_the_option() -> None:
    for lead in (-1, 70000):
        with pytest.raises(ConfigError) as err:
            render_slurm(_job(signal_lead=lead))
        assert err.value.option == "--signal-lead"


def test_submit_dry_run_prints_the_script_and_submits_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))  # no sbatch: it is never looked for
    result = CliRunner().invoke(
        app,
        ["slurm", "submit", "--dry-run", "--run-dir", str(tmp_path / "runs"),
         "--signal-lead", "90", "--", "train.py"],
    )  # fmt: skip
    assert result.exit_code == 0, result.stderr
    assert result.stdout.startswith("#!/bin/bash") and "--signal=B:USR1@90" in result.stdout
    assert "dry run: nothing submitted" in result.stderr
    assert not (tmp_path / "runs").exists()


def test_only_torchrun_is_offered_on_slurm() -> None:
    help_text = CliRunner().invoke(app, ["slurm", "render", "--help"], env={"COLUMNS": "200"})
    (line,) = [x for x in help_text.stdout.splitlines() if "--launcher" in x]
    assert "torchrun" in line
    for other in ("accelerate", "python", "mlx", "command"):
        assert other not in line
    result = CliRunner().invoke(app, ["slurm", "render", "--launcher", "python", "--", "t.py"])
    assert result.exit_code != 0


def test_the_render_takes_the_job_description_built_by_the_builder() -> None:
    """The Slurm job of a JobDescription is the golden case's: its script, launcher and
    env validated by the one builder (the option at fault named as ``corral run``
    names it), the allocation's side from the target."""
    from corral.cluster.model import Cluster
    from corral.errors import ConfigError
    from corral.job.describe import JobDescription, JobOptions
    from corral.slurm.render import SlurmTarget, slurm_job

    gpu = CASES["gpu"]
    options = JobOptions(
        command=(gpu.script, *gpu.args),
        python=gpu.python,
        env=dict(gpu.env),
        workdir=gpu.workdir,
        master_port=gpu.master_port,
        nccl_interface=gpu.nccl_interface,
        gloo_interface=gpu.gloo_interface,
        rdzv_timeout=gpu.rdzv_timeout,
        collective_timeout=gpu.dist_timeout,
        checkpoint_dir=gpu.checkpoint_dir,
        max_restarts=gpu.max_restarts,
    )
    target = SlurmTarget(
        nodes=gpu.nodes,
        gpus_per_node=gpu.gpus_per_node,
        cpus_per_task=gpu.cpus_per_task,
        partition=gpu.partition,
        account=gpu.account,
        time=gpu.time,
        job_name=gpu.job_name,
        output_dir=gpu.output_dir,
        sbatch_options=gpu.sbatch_options,
    )
    description = JobDescription(options, Cluster((), source="slurm"))
    assert slurm_job(description, target) == gpu
    assert render_slurm(slurm_job(description, target)) == render_slurm(gpu)
    for changes, option in (({"launcher": "python"}, "--launcher"), ({"env": {"1X": "y"}}, None)):
        bad = JobDescription(dataclasses.replace(options, **changes), description.cluster)
        with pytest.raises(ConfigError) as caught:
            render_slurm(slurm_job(bad, target))
        assert option is None or caught.value.option == option
