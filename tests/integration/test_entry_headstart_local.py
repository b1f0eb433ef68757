"""The ``corral`` command's entry point (:mod:`corral.cli.entry`) starts a ``local:N``
job's agents before the CLI loads (typer, rich, the job's schema), the job takes
those very agents, and agents the parsed options do not ask for are ended."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, cast

import psutil

import corral
from corral.cli.entry import EarlyStart, Sniffed, _end, _start, take
from corral.transport.local import LocalProcess

HOOK = """
import json, os, sys
import corral.transport.local as local

start, spawn, seen = local.LocalTransport.start, os.posix_spawnp, []
cli = ("typer", "rich", "pydantic", "corral.cli.main", "corral.cli.run")

async def recording(self, host, argv, **kwargs):
    proc = await start(self, host, argv, **kwargs)
    seen.append([host.name, proc.pid, sorted(m for m in cli if m in sys.modules), list(argv)])
    return proc

def spawning(path, argv, env, **kwargs):  # the entry point's agents
    pid = spawn(path, argv, env, **kwargs)
    seen.append(["early", pid, sorted(m for m in cli if m in sys.modules), list(argv)])
    return pid

local.LocalTransport.start = recording
os.posix_spawnp = spawning
from corral.cli.entry import main
sys.argv = ["corral", *%r]
try:
    main()
except SystemExit as exc:
    code = exc.code
print("SEEN " + json.dumps([code, seen]))
"""


def _corral(tmp_path: Path, *args: str) -> tuple[str, int, list[list[Any]]]:
    """``corral ARGS`` through the entry point; its output, exit code and each agent
    start (host, pid, which of the CLI's modules were loaded then, its command)."""
    (tmp_path / "hello.py").write_text("import os\nprint('hello from', os.environ['RANK'])\n")
    done = subprocess.run(
        [sys.executable, "-c", HOOK % (list(args),)],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
        env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(Path(corral.__file__).parents[1])},
    )
    out = done.stdout + done.stderr
    [line] = [x for x in done.stdout.splitlines() if x.startswith("SEEN ")]
    code, seen = json.loads(line[5:])
    return out, code, seen


RUN = ("run", "--hosts", "local:2", "--launcher", "python", "--run-dir", "runs")


def test_the_agents_start_before_the_cli_loads_and_the_job_takes_them(tmp_path: Path) -> None:
    out, code, seen = _corral(tmp_path, *RUN, "--", "hello.py")
    assert code == 0, out
    assert "hello from 0" in out and "hello from 1" in out
    # each node's agent started once, before typer, rich or the schema were imported
    assert [host for host, *_ in seen] == ["early", "early"], seen
    assert all(loaded == [] for _, _, loaded, _ in seen), seen


def test_without_the_separator_the_cli_starts_the_agents_itself(tmp_path: Path) -> None:
    """A script not after ``--``: its words could be read as options, so the entry
    point starts nothing and ``corral run`` starts the agents (once each)."""
    out, code, seen = _corral(tmp_path, *RUN, "hello.py")
    assert code == 0, out
    assert sorted(host for host, *_ in seen) == ["local-0", "local-1"], seen
    assert all("corral.cli.run" in loaded for _, _, loaded, _ in seen), seen


def test_a_refused_command_ends_the_agents_started_early(tmp_path: Path) -> None:
    out, code, seen = _corral(tmp_path, *RUN, "--nproc-per-node", "zero", "--", "hello.py")
    assert code == 2, out
    assert "--nproc-per-node" in out
    assert len(seen) == 2, out  # started before the options were parsed
    assert [pid for _, pid, *_ in seen if psutil.pid_exists(pid)] == []
    assert not (tmp_path / "runs").exists()


def test_agents_the_parsed_options_do_not_ask_for_are_ended() -> None:
    early = _start(Sniffed(nodes=2, python=None, job_id="entry-mismatch"))
    assert early is not None
    import corral.cli.entry as entry

    entry._early = early
    pids = _pids(early)
    assert len(pids) == 2 and all(psutil.pid_exists(p) for p in pids)
    try:
        assert take(3, None, None) is None  # 3 nodes, not 2
        assert entry._early is None
        gone = [p for p in pids if not psutil.pid_exists(p) or _zombie(p)]
        assert gone == pids
    finally:
        _end(early)


def test_the_job_id_picked_early_is_the_jobs() -> None:
    early = _start(Sniffed(nodes=1, python=None, job_id=None))
    assert early is not None
    import corral.cli.entry as entry

    entry._early = early
    try:
        [pid] = _pids(early)
        assert _environ(pid).get("CORRAL_JOB_ID") == early.job_id
        assert take(1, None, "another-id") is None  # asked for another job's agents
        assert _zombie(pid)  # ended
    finally:
        _end(early)
    again = _start(Sniffed(nodes=1, python=None, job_id=None))
    assert again is not None and again.job_id != early.job_id
    entry._early = again
    taken = take(1, None, None)
    assert isinstance(taken, EarlyStart) and taken.job_id == again.job_id
    assert taken.head is not None and taken.loop is not None
    [proc] = taken.head._ready.values()
    assert cast(LocalProcess, proc).pid == again.pids[0]

    async def _close() -> int:  # the head start's close ends an agent never asked for
        assert taken.head is not None
        await taken.head.close()
        return await proc.wait()

    assert taken.loop.run_until_complete(_close()) == 2  # its stdin ended without a plan
    taken.loop.close()


def _pids(early: EarlyStart) -> list[int]:
    """The pids of the agents ``early`` started."""
    return early.pids


def _environ(pid: int) -> dict[str, str]:
    """The environment ``pid`` was started with (once its exec has been seen)."""
    deadline = time.monotonic() + 30
    while not psutil.Process(pid).cmdline() and time.monotonic() < deadline:
        time.sleep(0.02)
    return psutil.Process(pid).environ()


def _zombie(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def test_the_entry_point_is_the_console_script() -> None:
    bin_corral = Path(sys.executable).with_name("corral")
    assert "corral.cli.entry import main" in bin_corral.read_text(), bin_corral
    assert os.access(bin_corral, os.X_OK)
