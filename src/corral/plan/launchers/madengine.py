"""The ``madengine`` launcher: seed 003's preset, ``madengine run`` on every node
with the node's ``multi_node_args`` (``--launcher madengine --tags MODEL
--shared-data-path PATH [--additional-args ARGS]``)."""

from __future__ import annotations

import shlex
from collections.abc import Mapping
from dataclasses import dataclass
from typing import ClassVar

from corral.contract import STREAMS_ENV
from corral.errors import ConfigError
from corral.plan.launchers.base import Launcher, NodeContext, NodeFacts, NodePlan, options_of
from corral.plan.spec import JobSpec, LauncherOptions

MADENGINE = "madengine"


@dataclass(frozen=True)
class MadengineOptions(LauncherOptions):
    """``--launcher madengine``'s options."""

    LAUNCHER: ClassVar[str] = "madengine"
    FLAGS: ClassVar[Mapping[str, str]] = {"tags": "--tags", "args": "--additional-args"}
    LEGACY: ClassVar[Mapping[str, str]] = {"tags": "madengine_tags", "args": "madengine_args"}

    tags: str | None = None
    """The model tags (``--tags``)."""
    args: str | None = None
    """Extra words for ``madengine run`` in shell syntax (``--additional-args``)."""


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
    words = options_of(spec, MadengineOptions).args
    try:
        return shlex.split(words or "")
    except ValueError as exc:
        raise ConfigError(f"cannot split {words!r}: {exc}", option="--additional-args") from exc


def madengine_argv(spec: JobSpec, facts: NodeFacts) -> tuple[str, ...]:
    """Seed 003's per-node command: ``madengine run --tags T --additional-context
    "{'multi_node_args': {...}}" --force-mirror-local P`` and the extra args."""
    tags = options_of(spec, MadengineOptions).tags
    assert tags and spec.shared_data_path  # checked by the launcher's validate
    return (
        MADENGINE,
        "run",
        "--tags",
        tags,
        "--additional-context",
        madengine_context(facts),
        "--force-mirror-local",
        spec.shared_data_path,
        *additional_args(spec),
    )


def _validate(spec: JobSpec) -> None:
    if not options_of(spec, MadengineOptions).tags:
        raise ConfigError("--launcher madengine needs --tags MODEL", option="--tags")
    if not spec.shared_data_path:
        raise ConfigError(
            "--launcher madengine needs --shared-data-path PATH (madengine's --force-mirror-local)",
            option="--shared-data-path",
        )
    additional_args(spec)


def _plan_node(ctx: NodeContext) -> NodePlan:
    ctx.env["NODE_RANK"] = str(ctx.facts.node_rank)
    ctx.env[STREAMS_ENV] = "socket"
    return NodePlan(madengine_argv(ctx.spec, ctx.facts))


LAUNCHER = Launcher(
    "madengine",
    _plan_node,
    options=MadengineOptions,
    validate=_validate,
    runs_own_command=True,
)
