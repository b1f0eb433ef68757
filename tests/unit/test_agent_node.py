"""The node agent as the coordinator sees it: a real ``python -m corral.agent``
driven through its stdin ops, its frames read (and every event validated with
``parse_event``, the probe's answer with ``read_answer``) from its stdout."""

from __future__ import annotations

import json
import os
import queue
import shutil
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
from pathlib import Path
from typing import IO, Any

import psutil
import pytest

import corral
from corral.agent.events import parse_event
from corral.agent.probe import read_answer
from corral.agent.protocol import EVENT, STDOUT, decode_header, encode_op
from corral.cluster import load_cluster
from corral.plan.render import plan_job
from corral.plan.spec import JobSpec

DEADLINE = 60.0  # generous: only reached when something is broken


class Agent:
    """One agent process; frames and stderr are collected by reader threads."""

    def __init__(self, argv: list[str] | None = None, env: dict[str, str] | None = None) -> None:
        self.proc = subprocess.Popen(
            argv or [sys.executable, "-m", "corral.agent"],
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            start_new_session=True,
        )
        self.frames: queue.Queue[tuple[bytes, int, bytes] | None] = queue.Queue()
        self.events: list[dict[str, Any]] = []
        self.output: dict[tuple[bytes, int], list[bytes]] = {}
        self.stderr_lines: queue.Queue[bytes | None] = queue.Queue()
        assert self.proc.stdout is not None and self.proc.stderr is not None
        threading.Thread(target=self._read_frames, args=(self.proc.stdout,), daemon=True).start()
        threading.Thread(target=self._read_stderr, args=(self.proc.stderr,), daemon=True).start()

    def _read_frames(self, out: IO[bytes]) -> None:
        while header := out.readline():
            kind, rank, length = decode_header(header)
            self.frames.put((kind, rank, out.read(length)))
        self.frames.put(None)

    def _read_stderr(self, err: IO[bytes]) -> None:
        for line in err:
            self.stderr_lines.put(line)
        self.stderr_lines.put(None)

    def send(self, op: dict[str, Any] | bytes) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(op if isinstance(op, bytes) else encode_op(op))
        self.proc.stdin.flush()

    def _next_frame(self, what: str) -> tuple[bytes, int, bytes]:
        try:
            frame = self.frames.get(timeout=DEADLINE)
        except queue.Empty:
            raise AssertionError(f"no {what} within {DEADLINE} s; events: {self.events}") from None
        if frame is None:
            self.frames.put(None)
            raise AssertionError(f"agent stdout ended before {what}; events: {self.events}")
        kind, rank, payload = frame
        if kind == EVENT:
            # every event the agent sends is valid, read as the coordinator reads it
            probe = json.loads(payload).get("event") == "probe"
            self.events.append(read_answer(json.loads(payload)) if probe else parse_event(payload))
        else:
            self.output.setdefault((kind, rank), []).append(payload)
        return frame

    def event(self, name: str, **match: Any) -> dict[str, Any]:
        """The next event called ``name`` whose fields equal ``match``."""
        while True:
            kind, _, _ = self._next_frame(f"event {name} {match}")
            if kind != EVENT:
                continue
            event = self.events[-1]
            if event["event"] == name and all(event.get(k) == v for k, v in match.items()):
                return event

    def stdout_of(self, rank: int, until: bytes) -> list[bytes]:
        """Rank ``rank``'s stdout frames, read until their bytes contain ``until``."""
        while until not in b"".join(self.output.get((STDOUT, rank), [])):
            self._next_frame(f"{until!r} on rank {rank}'s stdout")
        return self.output[(STDOUT, rank)]

    def stderr_line(self, containing: str) -> str:
        while True:
            try:
                raw = self.stderr_lines.get(timeout=DEADLINE)
            except queue.Empty:
                raise AssertionError(f"no agent stderr line with {containing!r}") from None
            if raw is None:
                self.stderr_lines.put(None)
                raise AssertionError(f"agent stderr ended before a line with {containing!r}")
            line = raw.decode()
            if containing in line:
                return line

    def stderr_rest(self) -> list[str]:
        """The stderr lines not read yet, to the end of the agent's stderr."""
        rest = []
        while (raw := self.stderr_lines.get(timeout=DEADLINE)) is not None:
            rest.append(raw.decode())
        self.stderr_lines.put(None)
        return rest

    def finish(self) -> int:
        """Wait for the agent to exit (its last event is node_exit)."""
        code = self.proc.wait(timeout=DEADLINE)
        assert self.proc.stdin is not None
        self.proc.stdin.close()
        return code

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=DEADLINE)


@pytest.fixture
def agents() -> Any:
    started: list[Agent] = []

    def make(argv: list[str] | None = None, env: dict[str, str] | None = None) -> Agent:
        agent = Agent(argv, env)
        started.append(agent)
        return agent

    yield make
    for agent in started:
        agent.kill()


def _start_op(
    tmp_path: Path, body: str, *, nproc: int = 2, **options: Any
) -> tuple[dict[str, Any], Path]:
    script = tmp_path / "train.py"
    script.write_text(textwrap.dedent(body))
    spec = JobSpec(
        script=str(script),
        launcher="python",
        nproc_per_node=nproc,
        master_port=0,
        python=sys.executable,
        workdir=str(tmp_path),
        run_dir=str(tmp_path / "runs"),
    )
    [command] = plan_job(spec, load_cluster("local:1"))
    node = command.to_json()
    node["hosts_master"] = False
    start = {"op": "start", "node": node, "grace": 10.0, "heartbeat_interval": 0.5, **options}
    return start, Path(node["env"]["CORRAL_NODE_DIR"])


def _gone(pids: list[int]) -> bool:
    deadline = time.monotonic() + DEADLINE
    while time.monotonic() < deadline:
        if not any(psutil.pid_exists(p) and _not_zombie(p) for p in pids):
            return True
        time.sleep(0.02)  # polling for the OS to finish, not synchronising with the agent
    return False


def _not_zombie(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def test_probe_answers_with_version_then_abort_exits(agents: Any, tmp_path: Path) -> None:
    agent = agents()
    agent.send({"op": "probe", "workdir": str(tmp_path), "port": 0})
    probe = agent.event("probe")
    assert probe["version"] == corral.__version__
    assert probe["workdir_ok"] is True and probe["executable"] == sys.executable
    assert isinstance(probe["port"], int) and probe["port"] > 0
    agent.send({"op": "abort"})
    assert agent.finish() == 0
    assert agent.events == [probe]  # nothing was started


def test_garbage_first_line_is_refused_without_traceback(agents: Any) -> None:
    agent = agents()
    agent.send(b"hello\n")
    assert agent.finish() == 2
    line = agent.stderr_line("corral agent:")
    assert "expected a probe or start op" in line
    assert agent.stderr_rest() == []  # one line, no traceback


RUN = """
    import os, sys
    from corral.sdk import report
    from corral.sdk._report import send_event
    rank = int(os.environ["RANK"])
    print(f"hello from {rank}", flush=True)
    send_event({"type": "node_exit", "code": 7})             # forged: dropped
    send_event({"type": "progress", "step": 1, "event": "rank_exit", "code": 9})
    report(2, 4, loss=0.5)
    if rank == 0:
        sys.stdout.write("10%|#  |\\r")                         # a progress bar: no newline
        sys.stdout.flush()
        go = os.path.join(os.environ["CORRAL_NODE_DIR"], "go")
        while not os.path.exists(go):
            pass
        sys.stdout.write("done\\n")
"""


def test_start_runs_ranks_and_reports_events_in_order(agents: Any, tmp_path: Path) -> None:
    agent = agents()
    start, node_dir = _start_op(tmp_path, RUN)
    agent.send(start)
    starts = [agent.event("rank_start", rank=r) for r in (0, 1)]
    agent.event("started")
    # a \r-terminated progress line reaches the coordinator without a newline
    frames = agent.stdout_of(0, b"10%|#  |\r")
    assert frames[-1].endswith(b"\r")
    (node_dir / "go").touch()
    end = agent.event("node_exit")
    assert end["code"] == 0 and end["ranks"] == {"0": 0, "1": 0}
    assert agent.finish() == 0
    exits = {e["rank"]: e for e in agent.events if e["event"] == "rank_exit"}
    assert {r: e["code"] for r, e in exits.items()} == {0: 0, 1: 0}
    assert {e["pid"] for e in starts} == {e["pid"] for e in exits.values()}
    names = [e["event"] for e in agent.events if e["event"] not in ("hb", "report")]
    assert names[:3] == ["rank_start", "rank_start", "started"]
    assert names[-3:] == ["rank_exit", "rank_exit", "node_exit"]
    reports = [e for e in agent.events if e["event"] == "report"]
    assert {(e["rank"], e["step"], e["total"]) for e in reports} == {
        (r, s, t) for r in (0, 1) for s, t in ((1, None), (2, 4))
    }
    assert all(e["event"] == "report" and "code" not in e for e in reports)
    assert not any(e["event"] == "node_exit" and e["code"] == 7 for e in agent.events[:-1])
    assert "dropped an invalid message from rank" in agent.stderr_line("dropped")
    assert b"".join(agent.output[(STDOUT, 1)]) == b"hello from 1\n"
    # host-side log: every byte once, in order, nothing added
    assert (node_dir / "logs" / "rank-0.log").read_bytes() == b"hello from 0\n10%|#  |\rdone\n"


BLOCK = """
    import os, signal, sys
    rank = int(os.environ["RANK"])
    if rank == 0:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)   # only SIGKILL ends this one
    print("ready", flush=True)
    while True:
        signal.pause()
"""


def _ready(agent: Agent, nproc: int = 2) -> list[int]:
    pids = [agent.event("rank_start", rank=r)["pid"] for r in range(nproc)]
    for rank in range(nproc):
        agent.stdout_of(rank, b"ready\n")
    return pids


def test_stop_with_grace_terms_then_kills_and_leaves_nothing(agents: Any, tmp_path: Path) -> None:
    agent = agents()
    start, _ = _start_op(tmp_path, BLOCK)
    agent.send(start)
    pids = _ready(agent)
    agent.send({"op": "stop", "grace": 0.5})
    assert agent.event("stopping")["reason"] == "stop requested"
    end = agent.event("node_exit")
    assert end["ranks"] == {"0": -9, "1": -15}  # SIGTERM first, SIGKILL for the one ignoring it
    assert agent.finish() == 0
    assert _gone(pids)


SELF_KILL = """
    import os, pathlib, signal, time
    rank = int(os.environ["RANK"])
    armed = pathlib.Path(__file__).with_name("rank0.armed")
    if rank == 0:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)   # only the teardown's SIGKILL ends it
        armed.touch()
    else:
        while not armed.exists():   # the teardown must find rank 0 already ignoring SIGTERM
            time.sleep(0.01)
        os.kill(os.getpid(), signal.SIGKILL)   # killed from outside the job, as by OOM
    while True:
        signal.pause()
"""


def test_rank_exit_says_whether_the_teardown_sent_its_signal(agents: Any, tmp_path: Path) -> None:
    # a root cause is told from a symptom by what happened: rank 1's SIGKILL came
    # before the agent signalled anything; rank 0's is the teardown's own
    agent = agents()
    start, _ = _start_op(tmp_path, SELF_KILL, grace=0.5)
    agent.send(start)
    first = agent.event("rank_exit", rank=1)
    assert (first["code"], first["teardown"]) == (-9, False)
    second = agent.event("rank_exit", rank=0)
    assert (second["code"], second["teardown"]) == (-9, True)
    agent.event("node_exit")
    assert agent.finish() == 0


def test_kill_ends_every_rank_at_once(agents: Any, tmp_path: Path) -> None:
    agent = agents()
    start, _ = _start_op(tmp_path, BLOCK)
    agent.send(start)
    pids = _ready(agent)
    agent.send({"op": "kill"})
    assert agent.event("stopping")["reason"] == "kill requested"
    assert agent.event("node_exit")["ranks"] == {"0": -9, "1": -9}
    assert agent.finish() == 0
    assert _gone(pids)


def test_lost_heartbeat_tears_the_node_down(agents: Any, tmp_path: Path) -> None:
    agent = agents()
    start, _ = _start_op(tmp_path, BLOCK, heartbeat_timeout=0.5, grace=0.2)
    agent.send(start)  # and no heartbeat after it
    pids = _ready(agent)
    assert agent.event("stopping")["reason"] == "coordinator heartbeat lost"
    assert agent.event("node_exit")["ranks"] == {"0": -9, "1": -15}
    assert agent.finish() == 0
    assert _gone(pids)


REQUEST = """
    import json, os
    from corral.sdk._report import request
    rank = int(os.environ["RANK"])
    event = {"type": "checkpoint", "step": 1, "path": f"/ckpt/r{rank}.pt"}
    reply = request(event, {"type": "replicated", "name": f"r{rank}.pt"}, timeout=60)
    print(json.dumps(reply), flush=True)
"""


def test_reply_op_reaches_the_rank_that_asked(agents: Any, tmp_path: Path) -> None:
    agent = agents()
    start, _ = _start_op(tmp_path, REQUEST)
    agent.send(start)
    asks: dict[int, dict[str, Any]] = {}
    while len(asks) < 2:
        ask = agent.event("report", type="checkpoint")
        asks[ask["rank"]] = ask
    assert all(a["ack"] is True and a["path"] == f"/ckpt/r{r}.pt" for r, a in asks.items())
    for rank in (0, 1):
        answer = {"type": "replicated", "name": f"r{rank}.pt", "ok": True, "error": None}
        agent.send({"op": "reply", "rank": rank, "message": answer})
    for rank in (0, 1):
        [line] = b"".join(agent.stdout_of(rank, b"\n")).splitlines()
        assert json.loads(line) == {
            "type": "replicated",
            "name": f"r{rank}.pt",
            "ok": True,
            "error": None,
        }
    assert agent.event("node_exit")["ranks"] == {"0": 0, "1": 0}
    assert agent.finish() == 0


def test_invalid_op_lines_are_named_and_the_agent_carries_on(agents: Any, tmp_path: Path) -> None:
    agent = agents()
    start, _ = _start_op(tmp_path, BLOCK, nproc=1)
    agent.send(start)
    _ready(agent, nproc=1)
    agent.send(b"this is not json\n")
    assert "ignoring an invalid op: not JSON" in agent.stderr_line("invalid op")
    agent.send({"op": "stop", "grace": "soon"})
    assert "ignoring an invalid op" in agent.stderr_line("invalid op")
    agent.send({"op": "launch-missiles"})
    assert "unknown op 'launch-missiles'" in agent.stderr_line("invalid op")
    agent.send({"op": "hb"})
    agent.send({"op": "kill"})
    assert agent.event("node_exit")["ranks"] == {"0": -9}
    assert agent.finish() == 0


# The agent, with what it imports and starts said on its stderr, in order.
WATCHED = """
import runpy, sys

def said(event, args):
    if event == "import" and args[0] in ("asyncio", "psutil", "corral.agent.node"):
        print("import", args[0], file=sys.stderr, flush=True)
    elif event == "subprocess.Popen":
        print("start", args[1][-1], file=sys.stderr, flush=True)

sys.addaudithook(said)
runpy.run_module("corral.agent", run_name="__main__", alter_sys=True)
"""


def test_the_node_starts_before_the_agent_loads_its_machinery(agents: Any, tmp_path: Path) -> None:
    """The ranks (or torchrun) start at the start message, not after the agent's
    asyncio import: they import their framework meanwhile. The agent walks its own
    process tree in /proc: psutil is never imported, not even for the teardown."""
    agent = agents([sys.executable, "-c", WATCHED])
    start, _ = _start_op(tmp_path, BLOCK)
    agent.send(start)
    pids = _ready(agent)
    said = []
    while len(said) < 4:  # two starts, two imports
        said.append(agent.stderr_line(""))
    first_import = next(i for i, line in enumerate(said) if line.startswith("import"))
    assert [line.split()[0] for line in said[:first_import]] == ["start", "start"], said
    assert {line.split()[1] for line in said[first_import:]} == {"asyncio", "corral.agent.node"}
    agent.send({"op": "kill"})
    assert agent.event("node_exit")["ranks"] == {"0": -9, "1": -9}
    assert agent.finish() == 0
    assert _gone(pids)
    rest = agent.stderr_rest()  # what the agent said after its first four lines
    assert not any(line.startswith("import psutil") for line in rest), rest


# The agent's start with a SIGTERM that arrives after the node was spawned and
# before the agent's own signal handlers exist.
SIGNALLED_EARLY = """
import json, os, signal, sys
from corral.agent.protocol import decode_op
from corral.agent.spawn import spawn_node

start = decode_op(sys.stdin.buffer.readline())
out = os.fdopen(os.dup(1), "wb")
os.dup2(2, 1)
spawned = spawn_node(start["node"])
os.kill(os.getpid(), signal.SIGTERM)
from corral.agent.node import run_agent

sys.exit(run_agent(start, out, os.dup(0), spawned))
"""


SLEEP = """
    import time
    while True:
        time.sleep(1)
"""


def test_a_signal_while_the_node_is_spawned_tears_it_down(agents: Any, tmp_path: Path) -> None:
    agent = agents([sys.executable, "-c", SIGNALLED_EARLY])
    start, _ = _start_op(tmp_path, SLEEP)
    agent.send(start)
    pids = [agent.event("rank_start", rank=r)["pid"] for r in (0, 1)]
    agent.event("started")
    assert agent.event("stopping")["reason"] == "agent signalled"
    assert agent.event("node_exit")["ranks"] == {"0": -15, "1": -15}  # stopped, not killed
    assert agent.finish() == 0
    assert _gone(pids)


def test_a_node_that_cannot_start_is_reported_and_leaves_no_socket(
    agents: Any, tmp_path: Path
) -> None:
    # the node dir under tmp_path is too long for a socket path: the agent binds its
    # socket in $XDG_RUNTIME_DIR, a short private one of this test's
    runtime = Path(tempfile.mkdtemp(dir="/tmp"))
    try:
        agent = agents(env={**os.environ, "XDG_RUNTIME_DIR": str(runtime)})
        start, _ = _start_op(tmp_path, RUN)
        start["node"]["argv"] = [str(tmp_path / "no-such-launcher")]
        agent.send(start)
        failed = agent.event("start_failed")
        assert "no-such-launcher" in failed["error"]
        assert agent.finish() == 3
        # the control socket spawn_node bound is gone with its directory
        assert list(runtime.iterdir()) == []
    finally:
        shutil.rmtree(runtime, ignore_errors=True)


def test_the_control_socket_is_bound_where_the_ranks_are_told(agents: Any, tmp_path: Path) -> None:
    runtime = Path(tempfile.mkdtemp(dir="/tmp"))
    try:
        agent = agents(env={**os.environ, "XDG_RUNTIME_DIR": str(runtime)})
        start, _ = _start_op(tmp_path, SOCKET, nproc=1)
        agent.send(start)
        [line] = b"".join(agent.stdout_of(0, b"\n")).splitlines()
        told = json.loads(line)
        assert told["address"].startswith(f"unix:{runtime}/corral-")
        assert told["mode"] == 0o600 and told["dir_mode"] == 0o700
        assert agent.event("node_exit")["ranks"] == {"0": 0}
        assert agent.finish() == 0
        assert list(runtime.iterdir()) == []
    finally:
        shutil.rmtree(runtime, ignore_errors=True)


SOCKET = """
    import json, os, stat
    address = os.environ["CORRAL_CONTROL"]
    path = address.removeprefix("unix:")
    mode = stat.S_IMODE(os.stat(path).st_mode)
    dir_mode = stat.S_IMODE(os.stat(os.path.dirname(path)).st_mode)
    print(json.dumps({"address": address, "mode": mode, "dir_mode": dir_mode}), flush=True)
"""
