"""Pure renderers of the launchers whose node command is not corral's own worker
line: the ``accelerate launch`` line a plan shows for reference, command
templates (``--launcher command``) and the madengine preset (seed 003).

A node's command template runs as ``bash -c RENDERED``: one process per node
that starts the node's ranks itself (like torchrun). Every placeholder value is
shell-quoted (:func:`shlex.quote`) before it is put in, so a value can never
break out of its word.
"""

from __future__ import annotations

import shlex
import string
from dataclasses import asdict, dataclass

from corral.errors import ConfigError
from corral.plan.spec import LR_SCALING, NODE_LAUNCHERS, JobSpec

PLACEHOLDERS: tuple[str, ...] = (
    "node_rank",
    "nnodes",
    "nproc_per_node",
    "world_size",
    "master_addr",
    "master_port",
    "host",
    "job_id",
    "nccl_interface",
    "gloo_interface",
)

MADENGINE = "madengine"


@dataclass(frozen=True)
class NodeFacts:
    """What a node's command may name: one field per placeholder of a template."""

    node_rank: int
    nnodes: int
    nproc_per_node: int
    world_size: int
    master_addr: str
    master_port: int
    host: str
    job_id: str
    nccl_interface: str = ""
    gloo_interface: str = ""


def template_fields(template: str) -> list[str]:
    """The placeholders ``template`` names, in order; a ConfigError for anything that
    is not one of :data:`PLACEHOLDERS` written as a plain ``{name}``."""
    if not template.strip():
        raise ConfigError("the command template is empty", option="--command-template")
    fields: list[str] = []
    try:
        parsed = list(string.Formatter().parse(template))
    except ValueError as exc:
        raise ConfigError(
            f"cannot parse the template: {exc} (write {{{{ and }}}} for literal braces)",
            option="--command-template",
        ) from exc
    for _, name, spec, conversion in parsed:
        if name is None:
            continue
        if name not in PLACEHOLDERS:
            shown = f"{{{name}}}" if name else "{}"
            raise ConfigError(
                f"unknown placeholder {shown}; the placeholders are "
                + " ".join(f"{{{p}}}" for p in PLACEHOLDERS)
                + " (write {{ and }} for a literal brace, e.g. ${{VAR}} for ${VAR})",
                option="--command-template",
            )
        if spec or conversion:
            raise ConfigError(
                f"placeholder {{{name}}} takes no format spec or conversion "
                "(values are inserted shell-quoted, as they are)",
                option="--command-template",
            )
        fields.append(name)
    return fields


def render_template(template: str, facts: NodeFacts) -> str:
    """``template`` with every placeholder replaced by its shell-quoted value."""
    template_fields(template)
    values = {k: shlex.quote(str(v)) for k, v in asdict(facts).items()}
    return template.format(**values)


def command_argv(template: str, facts: NodeFacts) -> tuple[str, ...]:
    """The node's process for ``--launcher command``: the rendered template run by bash."""
    return ("bash", "-c", render_template(template, facts))


def madengine_context(facts: NodeFacts) -> str:
    """The ``--additional-context`` value of seed 003: a Python dict literal of the
    node's ``multi_node_args`` (the interfaces only when known)."""
    args = {
        "RUNNER": "torchrun",
        "MASTER_ADDR": facts.master_addr,
        "MASTER_PORT": str(facts.master_port),
        "NNODES": str(facts.nnodes),
        "NODE_RANK": str(facts.node_rank),
    }
    if facts.nccl_interface:
        args["NCCL_SOCKET_IFNAME"] = facts.nccl_interface
    if facts.gloo_interface:
        args["GLOO_SOCKET_IFNAME"] = facts.gloo_interface
    return repr({"multi_node_args": args})


def additional_args(spec: JobSpec) -> list[str]:
    """``--additional-args`` split like a shell would (a ConfigError when it cannot be)."""
    try:
        return shlex.split(spec.madengine_args or "")
    except ValueError as exc:
        raise ConfigError(
            f"cannot split {spec.madengine_args!r}: {exc}", option="--additional-args"
        ) from exc


def madengine_argv(spec: JobSpec, facts: NodeFacts) -> tuple[str, ...]:
    """Seed 003's per-node command: ``madengine run --tags T --additional-context
    "{'multi_node_args': {...}}" --force-mirror-local P`` and the extra args."""
    assert spec.madengine_tags and spec.shared_data_path  # checked by validate_launcher
    return (
        MADENGINE,
        "run",
        "--tags",
        spec.madengine_tags,
        "--additional-context",
        madengine_context(facts),
        "--force-mirror-local",
        spec.shared_data_path,
        *additional_args(spec),
    )


def accelerate_reference(spec: JobSpec, facts: NodeFacts) -> tuple[str, ...]:
    """The ``accelerate launch`` line a node's ranks stand for (shown, never run).

    Accelerate 1.x has no ``--multi_node`` flag (the seed's line has one):
    ``--num_machines`` makes it multi-node and ``--multi_gpu`` picks torchrun's
    launcher; on a CPU host corral's ranks get ``ACCELERATE_USE_CPU=1`` instead
    (``accelerate launch --cpu`` would start one process, not a distributed group).
    """
    return (
        "accelerate",
        "launch",
        "--multi_gpu",
        "--num_machines",
        str(facts.nnodes),
        "--machine_rank",
        str(facts.node_rank),
        "--main_process_ip",
        facts.master_addr,
        "--main_process_port",
        str(facts.master_port),
        "--num_processes",
        str(facts.world_size),
        "--max_restarts",
        "0",
        spec.script,
        *spec.args,
    )


def validate_launcher(spec: JobSpec) -> None:
    """The launcher-specific options of ``spec`` make sense together (ConfigError)."""
    if spec.launcher in NODE_LAUNCHERS and spec.script:
        raise ConfigError(
            f"--launcher {spec.launcher} runs its own command on every node and takes no "
            f"SCRIPT (got {spec.script!r} after --)"
            + ("; put the script in --command-template" if spec.launcher == "command" else ""),
            option="--launcher",
        )
    if spec.launcher == "command":
        if not spec.command_template:
            raise ConfigError(
                "--launcher command needs --command-template 'TEMPLATE'",
                option="--command-template",
            )
        template_fields(spec.command_template)
    elif spec.command_template:
        raise ConfigError("applies to --launcher command only", option="--command-template")
    if spec.launcher == "madengine":
        if not spec.madengine_tags:
            raise ConfigError("--launcher madengine needs --tags MODEL", option="--tags")
        if not spec.shared_data_path:
            raise ConfigError(
                "--launcher madengine needs --shared-data-path PATH (madengine's "
                "--force-mirror-local)",
                option="--shared-data-path",
            )
        additional_args(spec)
    else:
        for value, option in (
            (spec.madengine_tags, "--tags"),
            (spec.madengine_args, "--additional-args"),
        ):
            if value:
                raise ConfigError("applies to --launcher madengine only", option=option)
    if spec.lr_scaling not in LR_SCALING:
        raise ConfigError(
            f"unknown rule {spec.lr_scaling!r}; choose one of {', '.join(LR_SCALING)}",
            option="--lr-scaling",
        )
    if spec.harness and spec.launcher not in ("torchrun", "python", "accelerate"):
        raise ConfigError(
            f"the plugin harness runs under --launcher accelerate, python or torchrun, "
            f"not {spec.launcher}",
            option="--harness",
        )
