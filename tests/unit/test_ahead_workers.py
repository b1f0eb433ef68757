"""torchrun's workers started ahead (:mod:`corral.agent.aheadworkers`): each held at
its gate, handed to torchrun for its worker command and run with exactly the
arguments and environment torchrun gives it; one whose environment differs in a
variable read before the gate is not used, and every one not handed out exits
without running anything."""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from corral.agent import aheadworkers
from corral.agent.gate import WORKER

SCRIPT = """
import json, os, sys
with open(sys.argv[1], "w") as fh:
    json.dump({"argv": sys.argv[1:], "rank": os.environ.get("RANK"),
               "omp": os.environ.get("OMP_NUM_THREADS"),
               "gone": "TORCHELASTIC_STALE" in os.environ}, fh)
"""


@pytest.fixture
def script(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    (tmp_path / "rank.py").write_text(SCRIPT)
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    monkeypatch.setenv("TORCHELASTIC_STALE", "x")
    yield tmp_path / "rank.py"
    aheadworkers.end_all()


def _argv(script: Path, *args: str) -> list[str]:
    return [sys.executable, "-u", "-m", WORKER, str(script), *args]


def test_a_worker_started_ahead_runs_torchruns_command_and_environment(
    script: Path, tmp_path: Path
) -> None:
    assert aheadworkers.start_ahead(2, _argv(script, "planned")) == 2
    out = tmp_path / "out.json"
    env = {k: v for k, v in os.environ.items() if k != "TORCHELASTIC_STALE"}
    env |= {"RANK": "1", "LOCAL_RANK": "1", "TORCHELASTIC_RUN_ID": "r"}
    popen = aheadworkers.take(_argv(script, str(out), "b 2"), env)
    assert popen is not None and popen.wait(timeout=60) == 0
    seen = json.loads(out.read_text())
    assert seen == {"argv": [str(out), "b 2"], "rank": "1", "omp": "1", "gone": False}
    assert len(aheadworkers._pool) == 1  # the other one waits for torchrun's next worker


def test_one_whose_environment_differs_before_the_gate_is_not_used(
    script: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert aheadworkers.start_ahead(2, _argv(script)) == 2
    pool = list(aheadworkers._pool)
    env = dict(os.environ) | {"OMP_NUM_THREADS": "4", "RANK": "0"}
    assert aheadworkers.take(_argv(script, str(tmp_path / "no.json")), env) is None
    assert "workers started ahead not used: OMP_NUM_THREADS differs" in capsys.readouterr().err
    assert aheadworkers._pool == []
    assert [a.popen.returncode for a in pool] == [0, 0]  # ended at their gates
    assert not (tmp_path / "no.json").exists()


def test_only_corrals_worker_is_started_ahead(script: Path) -> None:
    assert aheadworkers.start_ahead(2, [sys.executable, "-u", str(script)]) == 0
    assert aheadworkers._pool == []
