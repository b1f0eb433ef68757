"""The launchers, one module each, registered in :data:`LAUNCHER_TABLE`.

Each module (:mod:`~corral.plan.launchers.torchrun`, ``accelerate``, ``python``,
``mlx``, ``command``, ``madengine``) defines ``LAUNCHER``, a
:class:`~corral.plan.launchers.base.Launcher`: how it plans one node and, when it
has options of its own, their type (``JobSpec.launcher_options``). A new launcher
is a new module and one line here (and its name in
:data:`corral.plan.spec.LAUNCHERS`, which the command line reads without loading
the planners).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from corral.errors import ConfigError
from corral.plan.launchers import accelerate, command, madengine, mlx, python, torchrun
from corral.plan.launchers.accelerate import accelerate_reference
from corral.plan.launchers.base import Launcher, NodeFacts, foreign_options
from corral.plan.launchers.command import (
    PLACEHOLDERS,
    CommandOptions,
    command_argv,
    render_template,
    template_fields,
    template_of,
)
from corral.plan.launchers.madengine import (
    MADENGINE,
    MadengineOptions,
    additional_args,
    madengine_argv,
    madengine_context,
)
from corral.plan.launchers.mlx import MlxOptions
from corral.plan.spec import LAUNCHERS, LR_SCALING, JobSpec, LauncherOptions

LAUNCHER_TABLE: Mapping[str, Launcher] = {
    m.LAUNCHER.name: m.LAUNCHER for m in (torchrun, python, accelerate, mlx, command, madengine)
}
"""Every launcher by name, in the order :data:`~corral.plan.spec.LAUNCHERS` lists them."""

OPTION_TYPES: tuple[type[LauncherOptions], ...] = tuple(
    kind.options for kind in LAUNCHER_TABLE.values() if kind.options is not None
)


def launcher(name: str) -> Launcher:
    """The launcher called ``name`` (ConfigError naming ``--launcher`` if none is)."""
    try:
        return LAUNCHER_TABLE[name]
    except KeyError:
        raise ConfigError(
            f"unknown launcher {name!r}; choose one of {', '.join(LAUNCHERS)}",
            option="--launcher",
        ) from None


def launcher_options(name: str, flat: Mapping[str, Any]) -> LauncherOptions | None:
    """The typed options of launcher ``name`` from flat fields under their
    :attr:`~corral.plan.spec.LauncherOptions.LEGACY` names (``command_template``,
    ``mlx_backend``, ``madengine_tags``, ...; a None value is not given). Another
    launcher's option given with a value other than its default is a ConfigError
    naming that option."""
    own = launcher(name).options
    for kind in OPTION_TYPES:
        values = {f: flat[old] for f, old in kind.LEGACY.items() if flat.get(old) is not None}
        if kind is own:
            continue
        given = kind(**values)
        if given != kind():
            raise foreign_options(given)
    if own is None:
        return None
    return own(**{f: flat[old] for f, old in own.LEGACY.items() if flat.get(old) is not None})


def launcher_options_json(options: LauncherOptions | None) -> dict[str, Any] | None:
    """``options`` as JSON (its fields; None for none)."""
    if options is None:
        return None
    return {name: getattr(options, name) for name in options.FLAGS}


def validate_launcher(spec: JobSpec) -> None:
    """The launcher-specific options of ``spec`` make sense together (ConfigError)."""
    kind = launcher(spec.launcher)
    if kind.runs_own_command and spec.script:
        raise ConfigError(
            f"--launcher {spec.launcher} runs its own command on every node and takes no "
            f"SCRIPT (got {spec.script!r} after --)"
            + ("; put the script in --command-template" if spec.launcher == "command" else ""),
            option="--launcher",
        )
    options = spec.launcher_options
    if options is not None and (kind.options is None or not isinstance(options, kind.options)):
        raise foreign_options(options)
    kind.validate(spec)
    if spec.lr_scaling not in LR_SCALING:
        raise ConfigError(
            f"unknown rule {spec.lr_scaling!r}; choose one of {', '.join(LR_SCALING)}",
            option="--lr-scaling",
        )
    if spec.harness and not kind.runs_harness:
        harnessed = [name for name, k in LAUNCHER_TABLE.items() if k.runs_harness]
        raise ConfigError(
            f"the plugin harness runs under --launcher {', '.join(sorted(harnessed)[:-1])} or "
            f"{sorted(harnessed)[-1]}, not {spec.launcher}",
            option="--harness",
        )


__all__ = [
    "LAUNCHER_TABLE",
    "MADENGINE",
    "OPTION_TYPES",
    "PLACEHOLDERS",
    "CommandOptions",
    "Launcher",
    "MadengineOptions",
    "MlxOptions",
    "NodeFacts",
    "accelerate_reference",
    "additional_args",
    "command_argv",
    "launcher",
    "launcher_options",
    "launcher_options_json",
    "madengine_argv",
    "madengine_context",
    "render_template",
    "template_fields",
    "template_of",
    "validate_launcher",
]
