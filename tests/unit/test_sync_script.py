"""The user's sync script: missing -> warning, non-zero -> blocks, zero -> ok."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

from corral.sync.script import ScriptResult, run_sync_script, script_argv


def run(path: Path | str, **kw: object) -> tuple[ScriptResult, list[str]]:
    lines: list[str] = []
    result = asyncio.run(run_sync_script(path, on_line=lines.append, **kw))  # type: ignore[arg-type]
    return result, lines


def script(tmp_path: Path, body: str, *, executable: bool = True) -> Path:
    path = tmp_path / "sync dev.sh"
    path.write_text("#!/bin/sh\n" + body)
    if executable:
        path.chmod(0o755)
    return path


def test_missing_script_warns_and_does_not_block(tmp_path: Path) -> None:
    result, lines = run(tmp_path / "nope.sh")
    assert result.status == "missing" and not result.blocks
    assert "not found" in result.message and "continuing" in result.message
    assert lines == []
    result, _ = run(tmp_path)  # a directory is not a script either
    assert result.status == "missing" and "directory" in result.message


def test_zero_exit_is_ok_and_output_is_prefixed(tmp_path: Path) -> None:
    result, lines = run(script(tmp_path, "echo syncing\necho to-err >&2\n"))
    assert result.status == "ok" and result.exit_code == 0 and not result.blocks
    assert lines == ["[sync-script] syncing", "[sync-script] to-err"]


def test_non_zero_exit_blocks_with_code_and_tail(tmp_path: Path) -> None:
    path = script(tmp_path, "echo step 1\necho 'rsync: connection refused' >&2\nexit 7\n")
    result, _ = run(path)
    assert result.status == "failed" and result.blocks and result.exit_code == 7
    assert "exit code 7" in result.message and "connection refused" in result.message
    assert result.tail == ["step 1", "rsync: connection refused"]
    assert result.to_json()["status"] == "failed"


def test_killed_script_names_the_signal(tmp_path: Path) -> None:
    result, _ = run(script(tmp_path, "kill -TERM $$\n"))
    assert result.blocks and "SIGTERM" in result.message


def test_environment_names_the_cluster(tmp_path: Path) -> None:
    body = 'echo "$CORRAL_HOSTS|$CORRAL_HOST_NAMES|$CORRAL_SYNC_SRC|$CORRAL_SYNC_DEST|$EXTRA"\n'
    result, lines = run(
        script(tmp_path, body),
        hosts_spec="hosts.txt",
        host_names=["tb1", "tb2"],
        src="/code",
        dest="/srv/code",
        env={"EXTRA": "1"},
    )
    assert result.status == "ok"
    assert lines == ["[sync-script] hosts.txt|tb1 tb2|/code|/srv/code|1"]


def test_not_executable_runs_with_its_interpreter(tmp_path: Path) -> None:
    path = script(tmp_path, "echo via-shebang\n", executable=False)
    assert not os.access(path, os.X_OK)
    assert script_argv(path) == ["/bin/sh", str(path)]
    result, lines = run(path)
    assert result.status == "ok" and lines == ["[sync-script] via-shebang"]
    bare = tmp_path / "bare"
    bare.write_text("echo bare\n")
    assert script_argv(bare) == ["/bin/sh", str(bare)]


def test_long_lines_and_no_trailing_newline(tmp_path: Path) -> None:
    path = script(tmp_path, "head -c 300000 /dev/zero | tr '\\0' x\necho\nprintf end\n")
    result, lines = run(path)
    assert result.status == "ok"
    assert len(lines[0]) == len("[sync-script] ") + 300000 and lines[-1] == "[sync-script] end"
