"""``--nproc-per-node N|auto`` is parsed in one place (corral.job.option.parse_nproc)
for every verb: corral run/plan/check/calibrate (job.resolve), job submit and the
renders (cli.options), and the Slurm render's 'auto' (the GPUs asked per node)."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from corral.cli.main import _register, app
from corral.errors import ConfigError
from corral.job.option import parse_nproc

_register()
SRC = Path(__file__).parents[2] / "src" / "corral"


@pytest.mark.parametrize(("text", "value"), [(None, None), ("auto", "auto"), ("4", 4)])
def test_parse_nproc(text: str | None, value: object) -> None:
    assert parse_nproc(text) == value


@pytest.mark.parametrize(("text", "why"), [("0", "at least 1"), ("x", "not a number or 'auto'")])
def test_parse_nproc_refuses(text: str, why: str) -> None:
    with pytest.raises(ConfigError, match=why) as caught:
        parse_nproc(text)
    assert caught.value.option == "--nproc-per-node"


def test_the_number_is_parsed_in_one_place() -> None:
    spelled = [
        str(path.relative_to(SRC))
        for path in SRC.rglob("*.py")
        if "is not a number or 'auto'" in path.read_text(encoding="utf-8")
    ]
    assert spelled == ["job/option.py"]


def test_every_verb_refuses_zero_ranks_per_node_alike() -> None:
    """The same refusal, naming the flag, from corral plan and both renders."""
    runner = CliRunner()
    for verb in (["plan", "--hosts", "local:1"], ["slurm", "render"], ["k8s", "render"]):
        extra = ["--image", "img"] if verb[0] == "k8s" else []
        result = runner.invoke(app, [*verb, *extra, "--nproc-per-node", "0", "--", "t.py"])
        assert result.exit_code != 0, (verb, result.output)
        said = result.output + str(result.exception or "")
        assert "--nproc-per-node" in said and "at least 1" in said, verb
    slurm = runner.invoke(
        app, ["slurm", "render", "--gpus-per-node", "2", "--nproc-per-node", "auto", "--", "t.py"]
    )
    assert slurm.exit_code == 0, slurm.output
    assert "--nproc-per-node=2" in slurm.stdout or "--nproc-per-node 2" in slurm.stdout
