"""What a real local launch (``corral run --hosts local:2``) has loaded when it sends
the nodes their plan (the head start's, then with the probe: the ranks start held at
their gates) and their start message: neither pydantic nor typer's pydantic adapters,
whose import would delay every launch (they load once the nodes are started), nor
the checkpoint machinery a job on one filesystem never uses; and what it has loaded
when it starts the nodes' agents: none of the engine (corral.job.headstart)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import corral

HOOK = """
import json, sys
import corral.agent.protocol as protocol

encode, seen = protocol.encode_op, []

def recording(op):
    starts = op.get("op") == "prestart" or (op.get("op") == "probe" and op.get("prestart"))
    if starts or op.get("op") == "start":
        late = ("pydantic", "typer._adapters", "corral.recovery.checkpoints")
        if op.get("op") == "prestart":  # the head start's plan: before the engine loads
            late += ("corral.job.engine", "corral.job.supervisor", "corral.job.output")
        seen.append([op["op"], sorted(m for m in late if m in sys.modules)])
    return encode(op)

protocol.encode_op = recording
"""


RUN = """
from corral.cli.main import main
sys.argv = ["corral", "run", "--hosts", "local:2", "--launcher", "python",
            "--master-port", "0", "--run-dir", "runs", "--", %r]
try:
    main()
except SystemExit as exc:
    code = exc.code
"""


def _launch(tmp_path: Path, hook: str, seen: str, script: str = "hello.py") -> tuple[str, Any]:
    """Run a ``local:2`` launch of ``script`` (hello.py: a stdlib script) under
    ``hook``; its output and the value of ``seen`` in it afterwards."""
    hook += RUN % script + f'print("SEEN " + json.dumps({seen}))\n'
    (tmp_path / "hello.py").write_text("import os\nprint('hello from', os.environ['RANK'])\n")
    done = subprocess.run(
        [sys.executable, "-c", hook],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
        env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(Path(corral.__file__).parents[1])},
    )
    [line] = [x for x in done.stdout.splitlines() if x.startswith("SEEN ")]
    return done.stdout + done.stderr, json.loads(line[5:])


def test_a_local_launch_starts_its_nodes_before_importing_pydantic(tmp_path: Path) -> None:
    out, (code, seen, pydantic_later) = _launch(
        tmp_path, HOOK, '[code, seen, "pydantic" in sys.modules]'
    )
    assert code == 0, out
    assert "hello from 0" in out and "hello from 1" in out
    # each node's processes start (held) at the head start's plan, sent before the
    # engine is imported; the probes carry the engine's and they run at the start
    # message; nothing of pydantic is loaded by any
    assert [op for op, _ in seen] == ["prestart"] * 2 + ["probe"] * 2 + ["start"] * 2, seen
    assert all(loaded == [] for _, loaded in seen), seen
    assert pydantic_later  # the agents' events are validated with it after the start


#: The engine's modules: `corral run` on local:N imports them once its agents are started.
ENGINE = (
    "corral.job.build",
    "corral.job.engine",
    "corral.job.supervisor",
    "corral.job.output",
    "corral.job.summary",
    "corral.job.preflight",
    "corral.job.tracking",
    "corral.checks.gather",
    "corral.recovery.restart",
    "corral.track",
    "corral.sync.state",
    "rich.table",
)

SPAWN_HOOK = (
    f"ENGINE = {ENGINE!r}\n"
    + """
import json, sys
import corral.transport.local as local

start, seen = local.LocalTransport.start, []

async def recording(self, host, argv, **kwargs):
    checklist = ("corral.checks.timeouts", "corral.checks.stale", "urllib.request", *ENGINE)
    seen.append([host.name, sorted(m for m in checklist if m in sys.modules)])
    return await start(self, host, argv, **kwargs)

local.LocalTransport.start = recording
import corral.agent.protocol as protocol

encode, facts = protocol.encode_op, []

def probing(op):
    if op.get("op") == "probe":
        facts.append("facts" in op)
    return encode(op)

protocol.encode_op = probing
"""
)


def test_a_local_launch_starts_its_agents_before_the_checklist_loads(tmp_path: Path) -> None:
    """The agents' processes (and with them the nodes' held launchers) are started
    before the engine is imported, let alone the checklist's machinery; the job uses
    them (no node's agent is started twice)."""
    out, (code, seen, checked, facts) = _launch(
        tmp_path, SPAWN_HOOK, '[code, seen, "corral.checks.stale" in sys.modules, facts]'
    )
    assert code == 0, out
    assert sorted(host for host, _ in seen) == ["local-0", "local-1"], seen
    assert all(loaded == [] for _, loaded in seen), seen
    assert checked  # the checklist ran, after them
    # and posted what it asks before the probes were written: the master host's
    # probe carries the request for its facts (the agent answers them, no second process)
    assert sorted(facts) == [False, True], facts


REFUSED_HOOK = """
import json, sys
import corral.transport.local as local

start, pids = local.LocalTransport.start, []

async def recording(self, host, argv, **kwargs):
    proc = await start(self, host, argv, **kwargs)
    pids.append(proc.pid)
    return proc

local.LocalTransport.start = recording
"""


def test_a_refused_local_job_ends_the_agents_it_started_ahead(tmp_path: Path) -> None:
    """The agents start before the job's options are checked by the engine; a job it
    refuses (its script is missing) ran nothing and leaves no process behind."""
    out, (code, pids) = _launch(tmp_path, REFUSED_HOOK, "[code, pids]", "missing.py")
    assert code == 2, out
    assert "script missing.py not found" in out
    assert len(pids) == 2, out  # started ahead, before the refusal
    assert [pid for pid in pids if Path(f"/proc/{pid}").exists()] == []
    assert not (tmp_path / "runs").exists()
