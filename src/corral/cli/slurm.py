"""``corral slurm render|submit``: the job as a Slurm batch script, printed or submitted."""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Annotated

import typer

from corral.cli.options import NO_FLAGS, JobFlags, ScriptArg, job_flags
from corral.cluster.model import Cluster
from corral.console import make_console
from corral.errors import ConfigError, LaunchError
from corral.job.describe import JobDescription
from corral.job.ids import new_job_id
from corral.job.option import parse_nproc
from corral.private import private_dir, write_private
from corral.slurm.render import (
    DEFAULT_SIGNAL_LEAD,
    SlurmJob,
    SlurmTarget,
    env_items,
    forwarded_keys,
    render_slurm,
    sbatch_argv,
    slurm_job,
)

_S = "Slurm"
SBATCH_TIMEOUT = 120.0
"""Seconds ``sbatch`` may take (it retries while slurmctld does not answer)."""

NodesOpt = Annotated[
    int,
    typer.Option(
        "--nodes", metavar="N", help="Nodes to allocate, one task each.", rich_help_panel=_S
    ),
]
GpusOpt = Annotated[
    int,
    typer.Option(
        "--gpus-per-node",
        metavar="G",
        help="GPUs per node (0: a CPU job); also the default ranks per node.",
        rich_help_panel=_S,
    ),
]
CpusOpt = Annotated[
    int | None,
    typer.Option(
        "--cpus-per-task",
        metavar="C",
        help="CPUs for each node's task, shared by its ranks (default: one per rank).",
        rich_help_panel=_S,
    ),
]
PartitionOpt = Annotated[
    str | None,
    typer.Option("--partition", metavar="P", help="Slurm partition(s).", rich_help_panel=_S),
]
AccountOpt = Annotated[
    str | None,
    typer.Option("--account", metavar="A", help="Slurm account to charge.", rich_help_panel=_S),
]
TimeOpt = Annotated[
    str | None,
    typer.Option(
        "--time",
        metavar="HH:MM:SS",
        help="Time limit of each attempt (also D-HH:MM:SS or minutes).",
        rich_help_panel=_S,
    ),
]
JobNameOpt = Annotated[
    str,
    typer.Option(
        "--job-name",
        metavar="NAME",
        help="Slurm job name; output goes to NAME-JOBID.out and NAME-JOBID.err.",
        rich_help_panel=_S,
    ),
]
OutputDirOpt = Annotated[
    str | None,
    typer.Option(
        "--output-dir",
        metavar="DIR",
        help="Directory of the .out/.err files (default: the job's working directory). "
        "It must exist on the first node.",
        rich_help_panel=_S,
    ),
]
SbatchOpt = Annotated[
    list[str] | None,
    typer.Option(
        "--sbatch-option",
        metavar="OPTION",
        help="An extra #SBATCH line, such as --mem=64G or --exclusive (repeatable).",
        rich_help_panel=_S,
    ),
]
SignalLeadOpt = Annotated[
    int,
    typer.Option(
        "--signal-lead",
        metavar="SECONDS",
        help="Seconds before the time limit at which the ranks are asked to checkpoint "
        "(corral.sdk.checkpoint_requested()) and the job is requeued while --max-restarts "
        "allows; 0: never.",
        rich_help_panel=_S,
    ),
]


def _nproc(value: str | None, gpus: int) -> int | None:
    """``--nproc-per-node N|auto``: 'auto' is the GPUs asked per node (else 1)."""
    number = parse_nproc(value)
    return (gpus or 1) if number == "auto" else number


def _job(
    command: list[str] | None,
    flags: JobFlags,
    *,
    nodes: int,
    gpus_per_node: int,
    cpus_per_task: int | None,
    partition: str | None,
    account: str | None,
    time: str | None,
    job_name: str,
    output_dir: str | None,
    sbatch_option: list[str] | None,
    signal_lead: int,
) -> SlurmJob:
    """The SlurmJob of SCRIPT [ARGS] and the options: the job described as every entry
    point describes it, rendered by :func:`~corral.slurm.render.slurm_job`."""
    if not command:
        raise ConfigError("no script given: corral slurm render [OPTIONS] -- SCRIPT [ARGS...]")
    written, bare = env_items(flags["env"] or [])  # bare keys: forwarded at submit time
    options = flags.options(
        command,
        launcher=flags["launcher"] or "torchrun",
        nproc_per_node=_nproc(flags["nproc_per_node"], gpus_per_node),
        env=written,
        secret_env=tuple(flags["secret_env"] or ()),
    )
    target = SlurmTarget(
        nodes=nodes,
        gpus_per_node=gpus_per_node,
        cpus_per_task=cpus_per_task,
        partition=partition,
        account=account,
        time=time,
        job_name=job_name,
        output_dir=output_dir,
        signal_lead=signal_lead,
        sbatch_options=tuple(sbatch_option or ()),
        forward_env=bare,
    )
    return slurm_job(JobDescription(options, Cluster((), source="slurm")), target)


@job_flags("slurm", skip=("run_dir",))
def render(
    command: ScriptArg = None,
    nodes: NodesOpt = 1,
    gpus_per_node: GpusOpt = 0,
    cpus_per_task: CpusOpt = None,
    partition: PartitionOpt = None,
    account: AccountOpt = None,
    time: TimeOpt = None,
    job_name: JobNameOpt = "corral",
    output_dir: OutputDirOpt = None,
    sbatch_option: SbatchOpt = None,
    signal_lead: SignalLeadOpt = DEFAULT_SIGNAL_LEAD,
    flags: JobFlags = NO_FLAGS,  # the job's flags, see job_flags
) -> None:
    """Print the sbatch script that runs SCRIPT with torchrun on every node of a Slurm job.

    One task per node, c10d rendezvous on the first node, NODE_RANK from SLURM_NODEID.
    The job is requeued after a failure while --max-restarts allows, and each attempt
    resumes from --checkpoint-dir. --signal-lead seconds before the time limit the ranks
    are asked to checkpoint (corral.sdk.checkpoint_requested()) and the job is requeued
    while restarts are left. A bare --env K is not written into the script: submit
    it with sbatch --export=K (corral slurm submit does), as secrets must be.
    """
    job = _job(**locals())  # every parameter of this command, by name
    sys.stdout.write(render_slurm(job))


def _find_sbatch(job: SlurmJob) -> str:
    """sbatch's path, once the bare ``--env`` keys it forwards are known to be set here."""
    missing = [key for key in forwarded_keys(job) if key not in os.environ]
    if missing:
        raise ConfigError(
            f"{', '.join(missing)} not set here: a bare --env K forwards this shell's value",
            option="--env",
        )
    sbatch = shutil.which("sbatch")
    if sbatch is None:
        raise LaunchError(
            "sbatch not found on PATH: run this on a Slurm login node (or install Slurm's "
            "client, Debian: slurm-client), or print the script with corral slurm render"
        )
    return sbatch


def _sbatch(job: SlurmJob, sbatch: str, path: Path) -> str:
    """Run sbatch on the script at ``path``; the Slurm job id."""
    argv = [sbatch, *sbatch_argv(job, str(path))[1:]]
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=SBATCH_TIMEOUT)
    except subprocess.TimeoutExpired:
        raise LaunchError(f"sbatch did not answer within {SBATCH_TIMEOUT:g}s") from None
    except OSError as exc:
        raise LaunchError(f"sbatch could not be run: {exc}") from exc
    if done.returncode != 0:
        lines = (done.stderr or done.stdout).strip().splitlines()
        why = lines[-1] if lines else "no output"
        raise LaunchError(f"sbatch refused the job (exit {done.returncode}): {why}")
    job_id = done.stdout.strip().split(";")[0]
    if not job_id.isdigit():
        raise LaunchError(f"sbatch printed no job id: {done.stdout.strip()!r}")
    return job_id


@job_flags("slurm")
def submit(
    command: ScriptArg = None,
    nodes: NodesOpt = 1,
    gpus_per_node: GpusOpt = 0,
    cpus_per_task: CpusOpt = None,
    partition: PartitionOpt = None,
    account: AccountOpt = None,
    time: TimeOpt = None,
    job_name: JobNameOpt = "corral",
    output_dir: OutputDirOpt = None,
    sbatch_option: SbatchOpt = None,
    signal_lead: SignalLeadOpt = DEFAULT_SIGNAL_LEAD,
    dry_run: Annotated[
        bool,
        typer.Option(
            "--dry-run",
            help="Print the script and the sbatch command; write and submit nothing.",
        ),
    ] = False,
    flags: JobFlags = NO_FLAGS,  # the job's flags, see job_flags
) -> None:
    """Render the sbatch script (as corral slurm render) and submit it; prints the job id.

    The script is written to runs/ID/job.sbatch, readable by you only, and submitted with
    sbatch --parsable. Only what you asked for reaches the job: sbatch --export=NONE, or
    --export=K1,K2 for the bare --env keys, whose values sbatch takes from this shell.
    """
    options = dict(locals())  # every parameter of this command, by name
    run_dir = flags["run_dir"]
    dry = options.pop("dry_run")
    job = _job(**options)
    text = render_slurm(job)
    if dry:
        sys.stdout.write(text)
        argv = shlex.join(sbatch_argv(job, f"{run_dir}/ID/job.sbatch"))
        make_console().print(f"dry run: nothing submitted; would run {argv}", markup=False)
        return
    sbatch = _find_sbatch(job)
    folder = private_dir(Path(run_dir) / new_job_id())
    path = folder / "job.sbatch"
    write_private(path, text)
    slurm_id = _sbatch(job, sbatch, path.resolve())
    write_private(folder / "slurm-job-id", slurm_id + "\n")
    out = Path(output_dir or flags["workdir"] or ".") / f"{job_name}-{slurm_id}"
    console = make_console()
    console.print(
        f"submitted Slurm job {slurm_id} ({path}); output: {out}.out and {out}.err "
        f"on the first node; follow it with squeue -j {slurm_id}",
        markup=False,
        soft_wrap=True,
    )
    sys.stdout.write(slurm_id + "\n")


slurm_app = typer.Typer(
    name="slurm",
    help="Run the job on a Slurm cluster: render or submit an sbatch script.",
    no_args_is_help=True,
)


def register(app: typer.Typer) -> None:
    """Add the ``slurm`` group (render, submit) to ``app``."""
    ctx = {"allow_interspersed_args": False}
    slurm_app.command("render", context_settings=ctx)(render)
    slurm_app.command("submit", context_settings=ctx)(submit)
    app.add_typer(slurm_app, name="slurm")
