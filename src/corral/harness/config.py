"""Plan-time side of the harness: the plugin to run and the config it is given."""

from __future__ import annotations

import json
import os
import posixpath
from collections.abc import Sequence

from corral.errors import ConfigError
from corral.plan.spec import HarnessMode

CONFIG_FLAGS: tuple[str, ...] = ("--config_file", "--config-file")
PLUGIN_MAIN = "main.py"


def harness_target(target: str) -> tuple[HarnessMode, str]:
    """``(mode, script)`` for ``PLUGIN_DIR_OR_SCRIPT``: a path ending in ``.py`` is a
    script; anything else is a plugin directory, whose ``main.py`` is imported as
    ``main`` (seed 002's harness) and its ``main()`` called when it has one."""
    if target.endswith(".py"):
        return "script", target
    return "plugin", posixpath.join(target.rstrip("/") or "/", PLUGIN_MAIN)


def config_value(args: Sequence[str]) -> tuple[int, str] | None:
    """Where the plugin's ``--config_file PATH`` (or ``--config_file=PATH``) is in
    ``args``: the index of the word holding PATH, and PATH; None without one."""
    for index, word in enumerate(args):
        for flag in CONFIG_FLAGS:
            if word == flag:
                if index + 1 >= len(args):
                    raise ConfigError(f"{flag} needs a path", option="--config_file")
                return index + 1, args[index + 1]
            if word.startswith(flag + "="):
                return index, word.split("=", 1)[1]
    return None


def replace_config(args: Sequence[str], path: str) -> list[str]:
    """``args`` with the value of ``--config_file`` replaced by ``path``."""
    out = list(args)
    found = config_value(out)
    if found is not None:
        index, _ = found
        word = out[index]
        out[index] = word.split("=", 1)[0] + "=" + path if word.startswith("--") else path
    return out


def read_config(args: Sequence[str]) -> str | None:
    """The JSON text of the file the plugin's ``--config_file`` names, read here (None
    when the plugin is given no config); a ConfigError when it is not a JSON object."""
    found = config_value(args)
    if found is None:
        return None
    path = os.path.expanduser(found[1])
    try:
        with open(path, encoding="utf-8") as handle:
            text = handle.read()
    except OSError as exc:
        raise ConfigError(
            f"cannot read {path}: {exc.strerror or exc} (the plugin's config is read on "
            "this machine and adjusted for the job's world size)",
            option="--config_file",
        ) from exc
    try:
        config = json.loads(text)
    except ValueError as exc:
        raise ConfigError(f"{path} is not valid JSON: {exc}", option="--config_file") from exc
    if not isinstance(config, dict):
        raise ConfigError(f"{path} is not a JSON object", option="--config_file")
    return text
