"""``corral job``: the command-line client of ``corral serve`` (like ``ray job``).

``submit`` plans a job on the server's machines and dispatches it (or, with
``--queue``, queues it until they are free); ``list``, ``status`` and ``logs`` read
it back; ``stop`` tears it down. Every verb talks to ``--server`` (``CORRAL_SERVER``)
with the server's token, read from ``CORRAL_TOKEN`` or a token file: never from the
command line, and never printed. The requests are :mod:`corral.client`'s; what is
shown, :mod:`corral.cli.jobview`'s.

``logs -f`` (and ``submit -f``) follow the job's live events (Server-Sent Events),
resume after a dropped connection from the last event seen (``Last-Event-ID``),
and exit with the job's exit code as ``corral run`` would: 0 success, the failing
rank's own code, 124 timeout, 130 cancelled, 255 lost, 3 could not start.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Annotated, Any, get_args

import typer
from rich.console import Console

from corral.cli import jobview
from corral.cli.options import NO_FLAGS, JobFlags, job_flags
from corral.cli.remote import (
    DEFAULT_SERVER,
    JobArg,
    JsonOpt,
    ServerOpt,
    TokenFileOpt,
    connect,
    print_json,
)
from corral.client import jobs as api
from corral.client.token import is_loopback
from corral.console import make_console
from corral.errors import ConfigError, Conflict, NotFound
from corral.job.output import say
from corral.plan.spec import ServiceLauncher

_C = "Server"
_L = "Launch"
SUBMIT_LAUNCHERS: tuple[str, ...] = get_args(ServiceLauncher)
"""The launchers a job of ``corral serve`` can use (its ``JobRequest.launcher``)."""
PriorityOpt = Annotated[
    int,
    typer.Option(
        "--priority",
        metavar="N",
        help="A queued job's place in the queue (higher first; above 0: admins).",
    ),
]
AfterOpt = Annotated[
    list[str] | None,
    typer.Option(
        "--after",
        metavar="JOB",
        help="Start only after this job succeeds (repeatable; queues the job, which is "
        "cancelled if JOB fails, is cancelled or lost).",
    ),
]
TRANSIENT = ("busy with", "offline", "never health-checked")
"""Why a machine cannot take a job now but may later (--queue waits for them)."""
ADD_HINT = "add one with `corral machine add NAME --host ADDR` (or `corral machine add --local`)"


# -- options shared by every verb -------------------------------------------------------

SubmitCalibrationOpt = Annotated[
    str | None,
    typer.Option(
        "--calibration",
        metavar="FILE",
        help="A calibration file on the server (what `corral calibrate` saved): each rank's "
        "share of the work in proportion to its measured throughput; hosts are matched to "
        "the machines by name.",
        rich_help_panel=_L,
    ),
]
PluginOpt = Annotated[
    str | None,
    typer.Option(
        "--plugin",
        metavar="NAME",
        help="Run a plugin of the server's --plugins-dir (<dir>/NAME/main.py) instead of a "
        "SCRIPT; what follows `--` are its arguments.",
        rich_help_panel=_L,
    ),
]
MinGpuMemoryOpt = Annotated[
    float | None,
    typer.Option(
        "--min-gpu-memory",
        metavar="GIB",
        min=0,
        help="Only machines whose GPUs have at least this much memory (GiB).",
        rich_help_panel=_L,
    ),
]
ConfigScalingOpt = Annotated[
    str | None,
    typer.Option(
        "--lr-scaling",
        metavar="linear|sqrt|none",
        help="With --adjust-config: the learning rate times the world size (linear, the "
        "default), its square root (sqrt), or unchanged (none).",
        rich_help_panel=_L,
    ),
]


def explained(exc: Conflict | NotFound) -> Conflict | NotFound:
    """The server's refusal, with what to do about it: add a machine when none is
    registered, ``--queue`` when the machines are only busy or offline for now."""
    info = exc.info
    if info.get("registered") == 0:
        return Conflict(f"{exc.message}: no machine is registered; {ADD_HINT}", details=info)
    if isinstance(exc, NotFound) and "machine" in info:
        return NotFound(f"{exc.message} (corral machine list shows them)", details=info)
    reasons = [r for m in info.get("suggestions") or [] for r in m.get("reasons") or []]
    reasons += [r for rs in (info.get("unavailable") or {}).values() for r in rs]
    fits = int(info.get("needed") or 0) <= int(info.get("registered") or 0)
    if info.get("busy") or (fits and any(r.startswith(TRANSIENT) for r in reasons)):
        return Conflict(f"{exc.message} (--queue waits for them)", details=info)
    return exc


# -- verbs -------------------------------------------------------------------------------


def _request(
    command: list[str] | None,
    flags: JobFlags,
    *,
    server: str,
    machines: int | None,
    machine: list[str] | None,
    gpus_per_machine: int | None,
    config: str | None,
    adjust_config: bool,
    calibration: str | None = None,
    plugin: str | None = None,
    min_gpu_memory: float | None = None,
    lr_scaling: str | None = None,
    after: list[str] | None = None,
) -> dict[str, Any]:
    """The body of ``/distributed/plan`` for the submit options: the job's flags as
    the request's fields of the same name, sent when they differ from the default."""
    given = flags.given()
    launcher = given.pop("launcher", None) or "torchrun"
    command_template = given.get("command_template")
    if launcher not in SUBMIT_LAUNCHERS:
        raise ConfigError(
            f"unknown launcher {launcher!r}; choose one of {', '.join(SUBMIT_LAUNCHERS)}",
            option="--launcher",
        )
    if command_template is not None and launcher != "command":
        raise ConfigError("applies to --launcher command only", option="--command-template")
    if launcher == "command":
        if command:
            raise ConfigError(
                f"--launcher command runs its --command-template on every machine and takes "
                f"no SCRIPT (got {command[0]!r} after --); put the script in the template",
                option="--launcher",
            )
        if not command_template:
            raise ConfigError(
                "--launcher command needs --command-template 'TEMPLATE'",
                option="--command-template",
            )
        script, args = None, []
    elif plugin is not None:
        script, args = None, list(command or [])
    elif not command:
        raise ConfigError("no script given: corral job submit [OPTIONS] -- SCRIPT [ARGS...]")
    else:
        script, *args = command
        if not os.path.isabs(script) and os.path.isfile(script) and is_loopback(server):
            script = os.path.abspath(script)  # the server runs here: the same file
    selected = list(machine or [])
    if selected and machines is not None and machines != len(selected):
        raise ConfigError(
            f"--machines {machines} but {len(selected)} --machine given", option="--machines"
        )
    if adjust_config and not config:
        raise ConfigError("needs --config FILE.json", option="--adjust-config")
    if given.get("rebalance") and not calibration:
        raise ConfigError("needs --calibration FILE", option="--rebalance")
    if calibration and not os.path.isabs(calibration) and is_loopback(server):
        calibration = os.path.abspath(calibration)  # the server runs here: the same file
    code_dir = given.get("code_dir")
    if code_dir and not os.path.isabs(code_dir) and is_loopback(server):
        given["code_dir"] = os.path.abspath(code_dir)
    if lr_scaling is not None and not adjust_config:
        raise ConfigError("scales the --config: give --adjust-config too", option="--lr-scaling")
    requirements: dict[str, Any] = {"num_machines": len(selected) or machines or 1}
    if gpus_per_machine is not None:
        requirements["gpus_per_machine"] = gpus_per_machine
    if min_gpu_memory is not None:
        requirements["min_gpu_memory"] = min_gpu_memory
    body: dict[str, Any] = {
        "args": args,
        "launcher": launcher,
        "resource_requirements": requirements,
        "machine_selection": "manual" if selected else "auto",
        "selected_machines": selected,
        "env": given.pop("env", {}),
        "secret_env": given.pop("secret_env", []),
        "preflight": given.pop("preflight", True),
        "adjust_config": adjust_config,
        **given,
    }
    optional = {
        "script": script,
        "calibration": calibration,
        "plugin_name": plugin,
        "config_scaling": None if lr_scaling is None else {"rule": lr_scaling},
    }
    body.update({k: v for k, v in optional.items() if v is not None})
    if after:
        body["after"] = after
    if config:
        body["config"] = _read_config(config)
    return body


def _read_config(path: str) -> dict[str, Any]:
    try:
        data = json.loads(Path(path).read_text())
    except OSError as exc:
        raise ConfigError(f"cannot read {path}: {exc.strerror}", option="--config") from exc
    except ValueError as exc:
        raise ConfigError(f"{path} is not JSON: {exc}", option="--config") from exc
    if not isinstance(data, dict):
        raise ConfigError(f"{path} holds no JSON object", option="--config")
    return data


@job_flags("submit")
def submit(
    command: Annotated[
        list[str] | None,
        typer.Argument(
            help="The script (a path on the machines) and its arguments, after `--`.",
            show_default=False,
            metavar="-- SCRIPT [ARGS]...",
        ),
    ] = None,
    machines: Annotated[
        int | None,
        typer.Option(
            "--machines",
            metavar="N",
            min=1,
            help="How many machines (the server picks the best; default 1).",
            rich_help_panel=_L,
        ),
    ] = None,
    machine: Annotated[
        list[str] | None,
        typer.Option(
            "--machine",
            metavar="NAME",
            help="Run on this machine (name or id; repeatable): manual selection.",
            rich_help_panel=_L,
        ),
    ] = None,
    gpus_per_machine: Annotated[
        int | None,
        typer.Option(
            "--gpus-per-machine",
            metavar="N",
            min=0,
            help="GPUs (= ranks) each machine must have; 0 for CPU jobs.",
            rich_help_panel=_L,
        ),
    ] = None,
    flags: JobFlags = NO_FLAGS,  # the job's flags, see job_flags
    config: Annotated[
        str | None,
        typer.Option(
            "--config",
            metavar="FILE",
            help="A JSON file: the job's config (ranks read it with corral.sdk.job_config()).",
            rich_help_panel=_L,
        ),
    ] = None,
    adjust_config: Annotated[
        bool,
        typer.Option(
            "--adjust-config",
            help="Scale the --config to the world size: batch size divided, learning rate "
            "multiplied, output directory per rank.",
            rich_help_panel=_L,
        ),
    ] = False,
    calibration: SubmitCalibrationOpt = None,
    plugin: PluginOpt = None,
    min_gpu_memory: MinGpuMemoryOpt = None,
    lr_scaling: ConfigScalingOpt = None,
    queue: Annotated[
        bool,
        typer.Option(
            "--queue",
            help="When the machines are busy, wait in the server's queue (higher priority "
            "first, then first in first out) instead of failing; the job starts once they "
            "are free.",
        ),
    ] = False,
    priority: PriorityOpt = 0,
    after: AfterOpt = None,
    plan_only: Annotated[
        bool,
        typer.Option("--plan-only", help="Print the plan (per-node commands); start nothing."),
    ] = False,
    follow_: Annotated[
        bool,
        typer.Option(
            "-f",
            "--follow",
            help="Follow the job's output until it ends; exit with its exit code.",
        ),
    ] = False,
    server: ServerOpt = DEFAULT_SERVER,
    token_file: TokenFileOpt = None,
) -> None:
    """Plan SCRIPT on the server's machines and start it; print the job id.

    The job id is the one line on stdout (JOB=$(corral job submit ...)); the chosen
    machines and the master go to stderr. With --queue a job whose machines are busy
    waits for them (the reason shows on stderr). With -f the output follows and the
    exit code is the job's, as for corral run.
    """
    queue = queue or bool(after)  # a job that starts after others waits in the queue
    if queue and plan_only:
        raise ConfigError("a queued job is planned when it starts", option="--plan-only")
    if priority and not queue:
        raise ConfigError("a priority orders the queue: give --queue too", option="--priority")
    body = _request(
        command,
        flags,
        server=server,
        machines=machines,
        machine=machine,
        gpus_per_machine=gpus_per_machine,
        config=config,
        adjust_config=adjust_config,
        calibration=calibration,
        plugin=plugin,
        min_gpu_memory=min_gpu_memory,
        lr_scaling=lr_scaling,
        after=after,
    )
    err = make_console()
    with connect(server, token_file) as client:
        try:
            if plan_only:
                plan = api.plan(client, body)["execution_plan"]
            elif queue:
                plan = api.queue(client, body, priority=priority)
            else:
                plan = api.submit(client, body)
        except (Conflict, NotFound) as exc:
            raise explained(exc) from exc
        job_id = str(plan["job_id"])
        if plan_only:
            jobview.print_plan(plan, make_console(stderr=False))
            say(err, f"job {job_id} is planned, not started (corral job stop {job_id} drops it)")
            return
        if queue:
            _queued(plan, err)
        else:
            say(err, jobview.describe(plan))
            if plan.get("workload_weights"):
                say(err, jobview.weights_text(plan))
        sys.stdout.write(job_id + "\n")
        sys.stdout.flush()
        if follow_:
            raise typer.Exit(jobview.follow(client, job_id))


def _queued(answer: dict[str, Any], err: Console) -> None:
    """Say on stderr what a queued job waits for (or that it starts now)."""
    if answer.get("reason"):
        jobview.show_waiting(answer)
    else:
        say(err, f"job {answer['job_id']} is queued and starts now")


def resubmit(
    job_id: JobArg,
    priority: PriorityOpt = 0,
    after: AfterOpt = None,
    follow_: Annotated[
        bool,
        typer.Option(
            "-f", "--follow", help="Follow the new job's output until it ends; exit with its code."
        ),
    ] = False,
    server: ServerOpt = DEFAULT_SERVER,
    token_file: TokenFileOpt = None,
) -> None:
    """Submit a job again: a new job (yours) with the request JOB was submitted with,
    queued (it starts as soon as its machines are free); print the new job's id.

    A job that ran with secret env values is refused (the server never stored them):
    submit it again with corral job submit --env KEY.
    """
    err = make_console()
    with connect(server, token_file) as client:
        try:
            queued = api.resubmit(client, job_id, priority=priority, after=after or [])
        except (Conflict, NotFound) as exc:
            raise explained(exc) from exc
        new_id = str(queued["job_id"])
        _queued(queued, err)
        sys.stdout.write(new_id + "\n")
        sys.stdout.flush()
        if follow_:
            raise typer.Exit(jobview.follow(client, new_id))


def list_jobs(
    status: Annotated[
        str | None,
        typer.Option(
            "--status",
            metavar="STATE",
            help="Only jobs in these states (comma-separated: running,failed,...).",
        ),
    ] = None,
    limit: Annotated[
        int, typer.Option("--limit", metavar="N", min=1, max=1000, help="At most N jobs.")
    ] = 20,
    mine: Annotated[bool, typer.Option("--mine", help="Only my own jobs.")] = False,
    owner: Annotated[
        str | None, typer.Option("--owner", metavar="USER", help="Only this user's jobs.")
    ] = None,
    as_json: JsonOpt = False,
    server: ServerOpt = DEFAULT_SERVER,
    token_file: TokenFileOpt = None,
) -> None:
    """List the server's jobs, newest first (a job made from a task is named after it)."""
    with connect(server, token_file) as client:
        page = api.list_jobs(client, states=status, limit=limit, mine=mine, owner=owner)
    if as_json:
        print_json(page)
    elif not page["jobs"]:
        say(make_console(), "no jobs" + (f" {status}" if status else ""), "dim")
    else:
        make_console(stderr=False).print(jobview.jobs_table(page))


def status(
    job_id: JobArg,
    as_json: JsonOpt = False,
    server: ServerOpt = DEFAULT_SERVER,
    token_file: TokenFileOpt = None,
) -> None:
    """Show a job's status: master, nodes and their progress, attempts, root cause (for
    a queued job: what it waits for).

    Exit code: 0 while the job runs or waits; once it has ended, its exit code as corral
    run would have exited (255 when it was lost).
    """
    with connect(server, token_file) as client:
        data = api.status(client, job_id)
    if as_json:
        print_json(data)
    else:
        jobview.print_status(data, make_console(stderr=False))
    raise typer.Exit(api.exit_code_of(data))


def logs(
    job_id: JobArg,
    follow_: Annotated[
        bool,
        typer.Option(
            "-f",
            "--follow",
            help="Follow the output live until the job ends; exit with its exit code.",
        ),
    ] = False,
    host: Annotated[
        str | None, typer.Option("--host", metavar="HOST", help="Only this host.")
    ] = None,
    rank: Annotated[
        int | None, typer.Option("--rank", metavar="N", help="Only this global rank.")
    ] = None,
    server: ServerOpt = DEFAULT_SERVER,
    token_file: TokenFileOpt = None,
) -> None:
    """Print a job's output, each line prefixed [host:rank].

    With -f: follow it until the job ends (resuming after a dropped connection), then
    exit as corral run would: 0 success, the failing rank's code, 124 timeout, 130
    cancelled, 255 lost, 3 could not start.
    """
    with connect(server, token_file) as client:
        if follow_:
            raise typer.Exit(jobview.follow(client, job_id, host=host, rank=rank))
        for line in api.output(client, job_id):
            if jobview.line_wanted(line, host, rank):
                sys.stdout.write(line + "\n")
        sys.stdout.flush()


def stop(
    job_id: JobArg,
    force: Annotated[
        bool, typer.Option("--force", help="Kill every rank now instead of a graceful stop.")
    ] = False,
    server: ServerOpt = DEFAULT_SERVER,
    token_file: TokenFileOpt = None,
) -> None:
    """Stop a job on every node (a queued or planned one is cancelled; a job that has
    ended is left as it is)."""
    with connect(server, token_file) as client:
        answer = api.stop(client, job_id, force=force)
    sys.stdout.write(str(answer.get("message") or answer) + "\n")


def queue(
    move: Annotated[
        str | None,
        typer.Option("--move", metavar="JOB", help="Reorder this queued job (admins only)."),
    ] = None,
    priority: Annotated[
        int | None,
        typer.Option("--priority", metavar="N", help="With --move: its new priority."),
    ] = None,
    top: Annotated[
        bool, typer.Option("--top", help="With --move: ahead of every other queued job.")
    ] = False,
    as_json: JsonOpt = False,
    server: ServerOpt = DEFAULT_SERVER,
    token_file: TokenFileOpt = None,
) -> None:
    """List the queue in its order (higher priority first, then first in first out):
    position, job, priority, owner and what each job waits for; or, with --move JOB
    --priority N | --top, reorder it (admins)."""
    if move is None and (priority is not None or top):
        raise ConfigError("--priority and --top reorder the job given by --move", option="--move")
    if move is not None and (priority is None) == (not top):
        raise ConfigError("give --move JOB either --priority N or --top", option="--move")
    with connect(server, token_file) as client:
        if move is not None:
            api.move(client, move, priority=priority, top=top)
        entries = api.list_queue(client)
    if as_json:
        print_json(entries)
    elif not entries:
        say(make_console(), "the queue is empty", "dim")
    else:
        make_console(stderr=False).print(jobview.queue_table(entries))


job_app = typer.Typer(
    name="job",
    help="Submit, watch and stop jobs on a corral server (corral serve).",
    no_args_is_help=True,
    rich_markup_mode="rich",
)


def register(app: typer.Typer) -> None:
    """Add the ``job`` group (submit, list, status, logs, stop, queue) to ``app``."""
    job_app.command("submit", context_settings={"allow_interspersed_args": False})(submit)
    job_app.command("list")(list_jobs)
    job_app.command("status")(status)
    job_app.command("logs")(logs)
    job_app.command("stop")(stop)
    job_app.command("resubmit")(resubmit)
    job_app.command("queue")(queue)
    app.add_typer(job_app, name="job")
