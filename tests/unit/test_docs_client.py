"""The clients' connection options are documented where a team member looks for
them (README.md and docs/api.md), not only in ``--help``."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import typer

from corral.cli.main import _register, app

REPO = Path(__file__).resolve().parents[2]
_register()


def _server_panel_options() -> set[str]:
    """Every flag and env var of the options in the clients' "Server" panel (the
    verbs that talk to a server, not ``corral serve`` itself)."""
    found: set[str] = set()

    def walk(command: Any) -> None:
        for param in getattr(command, "params", []):
            if getattr(param, "rich_help_panel", None) == "Server":
                found.update(o for o in param.opts if o.startswith("--"))
                envvar = getattr(param, "envvar", None)
                found.update([envvar] if isinstance(envvar, str) else envvar or [])
        for name, sub in getattr(command, "commands", {}).items():
            if name != "serve":
                walk(sub)

    walk(typer.main.get_command(app))
    return found


def test_the_server_options_and_their_env_vars_are_documented() -> None:
    options = _server_panel_options()
    assert {"--server", "CORRAL_SERVER", "--token-file", "CORRAL_TOKEN_FILE"} <= options
    for doc in ("README.md", "docs/api.md"):
        text = (REPO / doc).read_text()
        missing = sorted(o for o in options | {"CORRAL_TOKEN"} if f"`{o}" not in text)
        assert not missing, f"{doc} does not mention {missing}"
