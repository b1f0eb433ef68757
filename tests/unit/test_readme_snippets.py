"""Every ```python block of README.md and docs/*.md runs as written.

Each block is run on its own in a fresh interpreter, in an empty directory,
with no ``CORRAL_*`` or torch.distributed variables in its environment (so the
SDK behaves as one plain process) and no GPU visible. A block that is not meant
to run starts with the marker line ``# not runnable: <reason>``; such a block
must still be valid Python.
"""

from __future__ import annotations

import ast
import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.conftest import LAUNCHER_ENV, require_torch

REPO = Path(__file__).resolve().parents[2]
DOCS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
MARKER = re.compile(r"#\s*not runnable:\s*(?P<reason>.*)")
FENCE = re.compile(r"^```python[ \t]*\n(?P<code>.*?)^```[ \t]*$", re.MULTILINE | re.DOTALL)
USES_TORCH = re.compile(r"^\s*(import torch|from torch[ .])", re.MULTILINE)
# The launcher's variables: without them the SDK is a single process (rank 0 of 1).
DIST_ENV = set(LAUNCHER_ENV)


@dataclass(frozen=True)
class Snippet:
    where: str  # file:line of the opening fence
    code: str

    @property
    def skip_reason(self) -> str | None:
        """The reason given by the ``# not runnable:`` marker, or None when it runs."""
        first = next((line for line in self.code.splitlines() if line.strip()), "")
        match = MARKER.fullmatch(first.strip())
        return None if match is None else match["reason"].strip()


def snippets(path: Path) -> list[Snippet]:
    text = path.read_text(encoding="utf-8")
    return [
        Snippet(f"{path.relative_to(REPO)}:{text.count(chr(10), 0, m.start()) + 1}", m["code"])
        for m in FENCE.finditer(text)
    ]


def snippet_env() -> dict[str, str]:
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("CORRAL_", "TORCHELASTIC_")) and k not in DIST_ENV
    }
    env.update(CUDA_VISIBLE_DEVICES="", OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    return env


def run_snippet(code: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", code],
        cwd=cwd,
        env=snippet_env(),
        capture_output=True,
        text=True,
        timeout=240,
    )


ALL = [s for path in DOCS for s in snippets(path)]
RUNNABLE = [s for s in ALL if s.skip_reason is None]
MARKED = [s for s in ALL if s.skip_reason is not None]


def test_the_readme_has_runnable_snippets() -> None:
    assert RUNNABLE, f"no runnable snippet found in {[str(p) for p in DOCS]}"
    assert any(s.where.startswith("README.md:") for s in RUNNABLE)


@pytest.mark.parametrize("snippet", RUNNABLE, ids=[s.where for s in RUNNABLE])
def test_snippet_runs(snippet: Snippet, tmp_path: Path) -> None:
    if USES_TORCH.search(snippet.code):
        require_torch()
    done = run_snippet(snippet.code, tmp_path)
    assert done.returncode == 0, (
        f"{snippet.where} failed (exit {done.returncode}):\n{done.stdout}\n{done.stderr}"
    )


def test_snippets_marked_not_runnable_say_why_and_parse() -> None:
    assert MARKED, "no snippet marked '# not runnable:' found: is the marker still parsed?"
    for snippet in MARKED:
        assert snippet.skip_reason, f"{snippet.where}: '# not runnable:' needs a reason"
        ast.parse(snippet.code, filename=snippet.where)


def test_a_failing_snippet_fails(tmp_path: Path) -> None:
    done = run_snippet(
        "from corral import sdk\nraise SystemExit(sdk.info().world_size + 2)\n", tmp_path
    )
    assert done.returncode == 3


def test_snippets_see_no_launcher_environment(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("CORRAL_CONTROL", "unix:/nonexistent")
    monkeypatch.setenv("WORLD_SIZE", "4")
    monkeypatch.setenv("RANK", "2")
    code = (
        "import os\n"
        "from corral import sdk\n"
        "print(sdk.info().rank, sdk.info().world_size, 'CORRAL_CONTROL' in os.environ)\n"
    )
    done = run_snippet(code, tmp_path)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["0", "1", "False"]


def test_marker_is_recognised() -> None:
    marked = Snippet("x.md:1", "\n# not runnable: needs a live cluster\nrun()\n")
    assert marked.skip_reason == "needs a live cluster"
    assert Snippet("x.md:1", "import os\n# not runnable: too late\n").skip_reason is None
