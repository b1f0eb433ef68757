"""The CLI is thin and starts fast: a verb imports only what it uses.

``corral --version`` and ``corral --help`` load no verb module (the root lists the
verbs from :data:`corral.cli.VERBS`), so neither the job engine nor httpx nor torch
is imported; the root's help reads exactly as with every verb loaded; no verb
module imports another; the SSH flags are defined once (:func:`ssh_flags`).
"""

from __future__ import annotations

import ast
import inspect
import json
import subprocess
import sys
from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

import corral.cli
from corral.cli import VERBS
from corral.cli.common import ssh_flags
from corral.cli.main import _register, app, plain_help
from corral.transport.options import SshOptions

HEAVY = ("corral.job.engine", "httpx", "torch", "corral.agent.events", "fastapi")

_PROBE = """
import json, sys
sys.argv = ["corral", *sys.argv[1:]]
from corral.cli.main import main
try:
    main()
except SystemExit:
    pass
sys.stderr.write("\\nMODULES " + json.dumps(sorted(sys.modules)) + "\\n")
"""


def _run(*args: str) -> tuple[str, set[str]]:
    """``corral ARGS`` in a new interpreter: its stdout and the modules it imported."""
    done = subprocess.run(
        [sys.executable, "-c", _PROBE, *args],
        capture_output=True,
        text=True,
        timeout=120,
        env={
            "COLUMNS": "200",
            "PATH": "/usr/bin:/bin",
            "PYTHONPATH": str(Path(corral.cli.__file__).parents[2]),
        },
    )
    line = done.stderr.rpartition("MODULES ")[2]
    return done.stdout, set(json.loads(line))


@pytest.mark.parametrize("flag", ["--version", "--help"])
def test_version_and_help_import_no_verb_and_nothing_heavy(flag: str) -> None:
    out, modules = _run(flag)
    assert out.strip()
    assert sorted(m for m in modules if m.startswith(HEAVY)) == []
    verbs = {f"corral.cli.{v.module}" for v in VERBS.values()}
    assert sorted(modules & verbs) == []


def test_a_verb_loads_its_own_module_only() -> None:
    out, modules = _run("run", "--help")
    assert "Usage: corral run [OPTIONS] -- SCRIPT [ARGS]..." in out
    assert "--ssh-password-env" in out and "--max-restarts" in out
    loaded = {m for m in modules if m.startswith("corral.cli.")}
    others = {f"corral.cli.{v.module}" for v in VERBS.values()} - {"corral.cli.run"}
    assert "corral.cli.run" in loaded and sorted(loaded & others) == []
    assert "httpx" not in modules


_register()  # the whole tree, as every verb loaded


def test_the_root_help_reads_as_with_every_verb_loaded() -> None:
    eager = CliRunner().invoke(app, ["--help"], env={"COLUMNS": "200"})
    lazy, _ = _run("--help")
    assert eager.exit_code == 0
    assert lazy == eager.output


def test_every_verb_is_in_the_table_with_its_summary() -> None:
    tree = typer.main.get_command(app)
    commands = getattr(tree, "commands", {})
    assert set(commands) == set(VERBS)
    for name, command in commands.items():
        first = plain_help(command.help or "").split("\n\n")[0]
        assert " ".join(first.split()) == plain_help(VERBS[name].summary), name


def _imported(path: Path) -> set[str]:
    """Every module ``path`` imports, at any depth (lazy imports included)."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
            names.update(f"{node.module}.{a.name}" for a in node.names)
    return names


def test_no_verb_module_imports_another() -> None:
    package = Path(corral.cli.__file__).parent
    verbs = {f"corral.cli.{v.module}" for v in VERBS.values()}
    found = {
        f"{module} -> {other}"
        for module in verbs
        for other in _imported(package / f"{module.rpartition('.')[2]}.py") & verbs
        if other != module
    }
    assert sorted(found) == []


def test_ssh_flags_build_the_ssh_options() -> None:
    seen: list[SshOptions] = []
    cli = typer.Typer()

    @cli.callback()
    def _root() -> None:
        pass

    @cli.command("all")
    @ssh_flags()
    def every(hosts: str = "x", ssh: SshOptions = SshOptions()) -> None:  # noqa: B008
        seen.append(ssh)

    @cli.command("some")
    @ssh_flags("key", "config")
    def some(ssh: SshOptions = SshOptions()) -> None:  # noqa: B008
        seen.append(ssh)

    runner = CliRunner()
    result = runner.invoke(
        cli, ["all", "--ssh-user", "ml", "--ssh-port", "2222", "--accept-new-host-keys"]
    )
    assert result.exit_code == 0, result.output
    assert seen[-1] == SshOptions(user="ml", port=2222, accept_new_host_keys=True)
    assert runner.invoke(cli, ["some", "--ssh-key", "k", "--ssh-config", "c"]).exit_code == 0
    assert seen[-1] == SshOptions(key="k", config="c")
    refused = runner.invoke(cli, ["some", "--ssh-user", "ml"])
    assert refused.exit_code == 2 and "--ssh-user" in refused.output
    assert list(inspect.signature(some).parameters) == ["ssh_key", "ssh_config"]
