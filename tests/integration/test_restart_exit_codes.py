"""A rank's own exit code is the rank's: code 3, which is also corral's "could not
start" exit code, is a failure the restart policy restarts (no torch: stdlib ranks)."""

from __future__ import annotations

from pathlib import Path

from .conftest import run_corral

EXITS_3_THEN_SUCCEEDS = """\
import os, sys
attempt = int(os.environ["CORRAL_ATTEMPT"])
print(f"attempt {attempt}", flush=True)
sys.exit(3 if attempt == 0 else 0)
"""


def test_a_rank_exiting_with_code_3_is_restarted(tmp_path: Path) -> None:
    script = tmp_path / "exit3.py"
    script.write_text(EXITS_3_THEN_SUCCEEDS)
    result = run_corral(
        "run",
        "--hosts",
        "local:1",
        "--launcher",
        "python",
        "--no-preflight",
        "--max-restarts",
        "1",
        "--restart-backoff",
        "0",
        "--run-dir",
        str(tmp_path / "runs"),
        "--",
        str(script),
        cwd=tmp_path,
    )
    out = result.stdout + result.stderr
    assert "could not start" not in out, out[-3000:]
    assert "attempt 0" in out and "attempt 1" in out, out[-3000:]
    assert result.returncode == 0, out[-3000:]
