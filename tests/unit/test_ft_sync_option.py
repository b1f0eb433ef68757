"""``--ft-sync`` / ``--ft-sync-every``: the schema's fields for sdk.fault_tolerant's
sync mode reach every rank's environment through the one builder (``corral plan``
plans what ``corral run`` runs), an ``--env`` of the same variable wins, and a value
the SDK would refuse is refused before anything starts, naming the flag."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from corral.cli.main import _register, app
from corral.errors import ConfigError

_register()


def _plan(tmp_path: Path, *flags: str) -> tuple[int, str, list[dict[str, str]]]:
    script = tmp_path / "t.py"
    script.write_text("print(1)\n")
    argv = ["plan", "--hosts", "local:2", "--launcher", "python", *flags, "--json"]
    result = CliRunner().invoke(app, [*argv, "--", str(script)])
    if result.exit_code:
        return result.exit_code, str(result.exception or result.output), []
    nodes = json.loads(result.stdout)["nodes"]
    return 0, "", [{k: v for k, v in n["env"].items() if k.startswith("CORRAL_FT_")} for n in nodes]


def test_the_sync_mode_and_h_reach_every_rank(tmp_path: Path) -> None:
    flags = ("--recovery", "in-place", "--ft-sync", "diloco", "--ft-sync-every", "7")
    code, out, envs = _plan(tmp_path, *flags)
    assert code == 0, out
    want = {"CORRAL_FT_SYNC": "diloco", "CORRAL_FT_SYNC_EVERY": "7"}
    assert envs == [want, want]


def test_without_them_the_script_decides(tmp_path: Path) -> None:
    code, out, envs = _plan(tmp_path, "--recovery", "in-place")
    assert code == 0, out
    assert envs == [{}, {}]


def test_an_env_of_the_same_variable_wins(tmp_path: Path) -> None:
    flags = ("--recovery", "in-place", "--ft-sync", "diloco", "--ft-sync-every", "7")
    code, out, envs = _plan(tmp_path, *flags, "--env", "CORRAL_FT_SYNC=localsgd")
    assert code == 0, out
    assert [e["CORRAL_FT_SYNC"] for e in envs] == ["localsgd", "localsgd"]
    assert [e["CORRAL_FT_SYNC_EVERY"] for e in envs] == ["7", "7"]


@pytest.mark.parametrize(
    ("flags", "words"),
    [
        (("--ft-sync", "diloco"), "--ft-sync: needs --recovery in-place"),
        (("--ft-sync-every", "9"), "--ft-sync-every: needs --recovery in-place"),
        (("--recovery", "in-place", "--ft-sync", "gossip"), "unknown sync mode 'gossip'"),
        (("--recovery", "in-place", "--ft-sync-every", "0"), "at least 1 step"),
        (
            ("--recovery", "in-place", "--ft-sync", "ddp", "--ft-sync-every", "5"),
            "needs --ft-sync diloco or localsgd",
        ),
    ],
)
def test_a_value_the_sdk_would_refuse_is_refused_naming_the_flag(
    tmp_path: Path, flags: tuple[str, ...], words: str
) -> None:
    script = tmp_path / "t.py"
    script.write_text("print(1)\n")
    argv = ["plan", "--hosts", "local:2", "--launcher", "python", *flags, "--", str(script)]
    result = CliRunner().invoke(app, argv)
    assert isinstance(result.exception, ConfigError), result.output  # main prints it, exit 2
    assert words in str(result.exception)
