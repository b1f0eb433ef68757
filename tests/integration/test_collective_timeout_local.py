"""``corral run --collective-timeout`` on local:2 (real processes, stdlib ranks): every
rank gets it as CORRAL_DIST_TIMEOUT (what corral.sdk.init_distributed applies to the
gloo/NCCL process group), an explicit ``--env CORRAL_DIST_TIMEOUT`` wins, and the
default master port (0) is a free port picked at launch."""

from __future__ import annotations

import re
from pathlib import Path

from .conftest import run_corral

SCRIPT = (
    "import os\n"
    "print('dist-timeout', os.environ.get('CORRAL_DIST_TIMEOUT'), os.environ['MASTER_PORT'])\n"
)


def _lines(tmp_path: Path, run_dir: Path, *flags: str) -> list[tuple[str, str]]:
    (tmp_path / "t.py").write_text(SCRIPT)
    done = run_corral(
        "run", "--hosts", "local:2", "--launcher", "python", "--no-preflight",
        "--run-dir", str(run_dir), *flags, "--", "t.py",
        cwd=tmp_path,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    return re.findall(r"dist-timeout (\S+) (\d+)", done.stdout)


def test_every_rank_gets_the_collective_timeout(tmp_path: Path, run_dir: Path) -> None:
    found = _lines(tmp_path, run_dir, "--collective-timeout", "33")
    assert [t for t, _ in found] == ["33", "33"]
    ports = {int(p) for _, p in found}
    assert len(ports) == 1 and 0 not in ports  # 0 (the default): one free port, picked
    env_wins = _lines(
        tmp_path, run_dir, "--collective-timeout", "33", "--env", "CORRAL_DIST_TIMEOUT=7"
    )
    assert [t for t, _ in env_wins] == ["7", "7"]
