"""The ``command`` launcher: a command template run on every node (``--launcher
command --command-template TEMPLATE``).

A node's command template runs as ``bash -c RENDERED``: one process per node
that starts the node's ranks itself (like torchrun). Every placeholder value is
shell-quoted (:func:`shlex.quote`) before it is put in, so a value can never
break out of its word.
"""

from __future__ import annotations

import shlex
import string
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import ClassVar

from corral.contract import STREAMS_ENV
from corral.errors import ConfigError
from corral.plan.launchers.base import Launcher, NodeContext, NodeFacts, NodePlan, options_of
from corral.plan.spec import JobSpec, LauncherOptions

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


@dataclass(frozen=True)
class CommandOptions(LauncherOptions):
    """``--launcher command``'s options."""

    LAUNCHER: ClassVar[str] = "command"
    FLAGS: ClassVar[Mapping[str, str]] = {"template": "--command-template"}
    LEGACY: ClassVar[Mapping[str, str]] = {"template": "command_template"}

    template: str | None = None
    """The per-node command (``--command-template``), placeholders in braces."""


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


def template_of(spec: JobSpec) -> str | None:
    """The job's command template (None unless its launcher is ``command``)."""
    options = spec.launcher_options
    return options.template if isinstance(options, CommandOptions) else None


def _validate(spec: JobSpec) -> None:
    template = options_of(spec, CommandOptions).template
    if not template:
        raise ConfigError(
            "--launcher command needs --command-template 'TEMPLATE'",
            option="--command-template",
        )
    template_fields(template)


def _plan_node(ctx: NodeContext) -> NodePlan:
    # one process per node that starts the ranks itself (like torchrun); a corral
    # worker it starts reports its rank over the control socket
    template = options_of(ctx.spec, CommandOptions).template
    assert template is not None  # validated
    ctx.env["NODE_RANK"] = str(ctx.facts.node_rank)
    ctx.env[STREAMS_ENV] = "socket"
    return NodePlan(command_argv(template, ctx.facts))


LAUNCHER = Launcher(
    "command",
    _plan_node,
    options=CommandOptions,
    validate=_validate,
    runs_own_command=True,
)
