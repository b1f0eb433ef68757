"""``corral plan``'s printed lines, pasted into bash as they are: a ``local:N`` node's
line creates the working directory it ``cd``s into, and an SSH node's line puts its
node dir under ``$HOME`` (never a literal ``./~/.corral/...``)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from .conftest import run_corral

# Runs as a rank would: writes into its node dir and its working directory.
PROBE = """
import os
node_dir = os.environ["CORRAL_NODE_DIR"]
os.makedirs(node_dir, exist_ok=True)
open(os.path.join(node_dir, "probe"), "w").write(os.getcwd())
open("ran-here", "w").write(os.environ["RANK"])
"""


def _printed_lines(out: str) -> list[str]:
    return [line for line in out.splitlines() if line.startswith(("cd ", "mkdir -p "))]


def _bash(line: str, cwd: Path, home: Path) -> subprocess.CompletedProcess[str]:
    env = {"HOME": str(home), "PATH": os.environ["PATH"]}
    return subprocess.run(
        ["bash", "-c", line], cwd=cwd, env=env, capture_output=True, text=True, timeout=120
    )


def _tildes(root: Path) -> list[Path]:
    return [p for p in root.rglob("*") if "~" in p.name]


def test_a_local_line_runs_as_printed(tmp_path: Path) -> None:
    (tmp_path / "probe.py").write_text(PROBE)
    home = tmp_path / "home"
    home.mkdir()
    done = run_corral(
        "plan", "--hosts", "local:2", "--launcher", "python", "--job-id", "pl1", "--", "probe.py",
        cwd=tmp_path,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    lines = _printed_lines(done.stdout)
    assert len(lines) == 2 and not (tmp_path / "runs").exists()  # a dry run writes nothing
    shell = tmp_path / "elsewhere"  # where the user pastes it
    shell.mkdir()
    for rank, line in enumerate(lines):
        result = _bash(line, shell, home)
        assert result.returncode == 0, result.stderr
        work = tmp_path / "runs" / "pl1" / "nodes" / f"local-{rank}" / "work"
        assert (work / "ran-here").read_text() == str(rank)
        assert (work.parent / "probe").read_text() == str(work)
    assert "python3 above" not in done.stdout  # local nodes run this interpreter
    assert _tildes(tmp_path) == []


def test_an_ssh_node_line_puts_the_node_dir_under_home(tmp_path: Path) -> None:
    (tmp_path / "probe.py").write_text(PROBE)
    home = tmp_path / "home"
    home.mkdir()
    done = run_corral(
        "plan", "--hosts", "h1", "--launcher", "python", "--python", sys.executable,
        "--job-id", "pl2", "--", "probe.py",
        cwd=tmp_path,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    (line,) = _printed_lines(done.stdout)
    assert "python3 above" not in done.stdout  # --python given: nothing to resolve
    result = _bash(line, tmp_path, home)  # the line as it would run on h1
    assert result.returncode == 0, result.stderr
    node_dir = home / ".corral" / "runs" / "pl2" / "h1"
    assert (node_dir / "probe").read_text() == str(tmp_path)
    assert (tmp_path / "ran-here").read_text() == "0"
    assert _tildes(tmp_path) == []
