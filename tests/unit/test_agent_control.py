"""The ranks' control socket: private to the job's user, and authenticated.

The server side (corral.agent.control) over a real unix socket, and a real node
agent (``python -m corral.agent``) running one rank that reports progress.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import socket
import stat
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from corral.agent import control
from corral.agent.control import ControlServer, peer_uid
from corral.agent.controlsock import socket_base_dir
from corral.agent.protocol import EVENT, decode_header
from corral.redact import REDACTED
from corral.sdk._report import auth_line
from tests.conftest import missing_dependency

NOBODY = 65534
PROGRESS = b'{"type": "progress", "step": 999}\n'
INTRUSION = b"ctl 0\n" + PROGRESS


def _mode(path: str | Path) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


def _wait_for(check: Callable[[], bool], what: str, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.01)


class Served:
    """A ControlServer on an event loop of its own thread; records what each
    authenticated connection sent."""

    def __init__(self, base_dir: Path) -> None:
        self.calls: list[list[bytes]] = []
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self.server = ControlServer(self._handler, base_dir=str(base_dir))
        self._run(self.server.start())
        assert self.server.path is not None and self.server.directory is not None
        self.path: str = self.server.path
        self.directory: str = self.server.directory

    def _run(self, coro: Any) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(30)

    async def _handler(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        lines: list[bytes] = []
        self.calls.append(lines)
        while line := await reader.readline():
            lines.append(line)
        writer.close()

    async def _close(self) -> None:
        self.server.close()

    def close(self) -> None:
        self._run(self._close())
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(30)
        self.loop.close()


@pytest.fixture
def served(tmp_path: Path) -> Iterator[Served]:
    server = Served(tmp_path)
    yield server
    server.close()


def _hung_up(path: str, data: bytes) -> bool:
    """Connect, send ``data``; True when the server hangs up on us (refused), False
    when it keeps listening (accepted)."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(10.0)  # only a (wrongly) accepted connection waits this long
        sock.connect(path)
        try:
            sock.sendall(data)
            return sock.recv(100) == b""
        except (BrokenPipeError, ConnectionResetError):  # closed before or while we sent
            return True
        except TimeoutError:
            return False


@pytest.fixture
def short_tmp() -> Iterator[Path]:
    """A fresh dir with a short path (an xdist worker's ``tmp_path`` is 10 characters
    longer, too long for a socket path with room to spare)."""
    path = Path(tempfile.mkdtemp(prefix="ctl-"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


def test_socket_is_private_random_and_removed_on_close(short_tmp: Path) -> None:
    tmp_path = short_tmp
    served = Served(tmp_path)
    first = Served(tmp_path)
    try:
        assert _mode(served.directory) == 0o700
        assert stat.S_ISSOCK(os.stat(served.path).st_mode) and _mode(served.path) == 0o600
        assert Path(served.directory).parent == tmp_path
        assert len(served.path) < 100  # fits sun_path
        assert served.server.address == f"unix:{served.path}"
        assert served.server.env() == {
            "CORRAL_CONTROL": f"unix:{served.path}",
            "CORRAL_CONTROL_TOKEN": served.server.token,
        }
        # nothing guessable: another server gets another name, directory and token
        assert os.path.basename(first.path) != os.path.basename(served.path)
        assert first.directory != served.directory
        assert first.server.token != served.server.token and len(served.server.token) == 32
    finally:
        served.close()
        first.close()
    assert not os.path.exists(served.directory) and not os.path.exists(first.directory)
    served.server.close()  # idempotent


def test_the_right_token_is_served(served: Served) -> None:
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.connect(served.path)
        sock.sendall(auth_line(served.server.token) + INTRUSION)
    _wait_for(lambda: served.calls == [[b"ctl 0\n", PROGRESS]], "the handler to see the lines")
    assert served.server.refused == 0


@pytest.mark.parametrize(
    "first",
    [
        b"",  # straight to business
        b"auth \n",
        b"auth 0123456789abcdef0123456789abcdef\n",  # a well-formed wrong token
        b"AUTH TOKEN\n",
    ],
    ids=["none", "empty", "wrong", "garbage"],
)
def test_a_connection_without_the_token_is_refused_and_changes_nothing(
    served: Served, first: bytes
) -> None:
    assert _hung_up(served.path, first + INTRUSION)
    assert served.calls == []
    assert served.server.refused == 1


def test_the_token_must_be_the_whole_first_line(served: Served) -> None:
    token_line = auth_line(served.server.token)
    assert _hung_up(served.path, token_line[:-1] + b"0\n" + INTRUSION)
    assert _hung_up(served.path, token_line[:-2] + b"\n" + INTRUSION)
    assert served.calls == [] and served.server.refused == 2


def test_a_silent_connection_is_dropped(served: Served, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(control, "AUTH_TIMEOUT", 0.2)
    assert _hung_up(served.path, b"")
    assert served.calls == [] and served.server.refused == 1


def _as_nobody(action: Callable[[], int]) -> int:
    """Run ``action`` in a forked child as uid/gid 65534; its exit code (an exception
    in the child fails the test with its repr)."""
    if os.geteuid() != 0:
        missing_dependency("connecting as another user needs root")
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # child: only syscalls, then _exit
        code = 99
        try:
            os.close(read_end)
            os.setgid(NOBODY)
            os.setuid(NOBODY)
            code = action()
        except Exception as exc:
            os.write(write_end, repr(exc).encode())
        finally:
            os._exit(code)
    os.close(write_end)
    with os.fdopen(read_end, "rb") as pipe:
        error = pipe.read().decode()
    _, status = os.waitpid(pid, 0)
    assert not error, f"in the child: {error}"
    return os.waitstatus_to_exitcode(status)


def test_another_user_cannot_reach_the_socket(served: Served) -> None:
    def connect() -> int:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
            try:
                sock.connect(served.path)
            except PermissionError:
                return 0
        return 1

    assert _as_nobody(connect) == 0
    assert served.calls == [] and served.server.refused == 0


def test_another_user_is_refused_even_with_the_token() -> None:
    base = Path(tempfile.mkdtemp(prefix="corral-test-"))  # tmp_path is root's only
    served = Served(base)
    try:
        # as if the directory and the socket were open to all: the peer check still holds
        for path, mode in ((base, 0o711), (served.directory, 0o711), (served.path, 0o666)):
            os.chmod(path, mode)
        hello = auth_line(served.server.token) + INTRUSION
        assert _as_nobody(lambda: 0 if _hung_up(served.path, hello) else 1) == 0
        assert served.calls == []
        assert served.server.refused == 1
    finally:
        served.close()
        shutil.rmtree(base)


def test_peer_uid_is_the_connecting_process_user(tmp_path: Path) -> None:
    left, right = socket.socketpair(socket.AF_UNIX)
    with left, right:
        assert peer_uid(left) == os.geteuid()


def test_base_dir_prefers_a_private_xdg_runtime_dir(
    short_tmp: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    tmp_path = short_tmp
    runtime = tmp_path / "run"
    runtime.mkdir(mode=0o700)
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(runtime))
    assert socket_base_dir() == str(runtime)
    os.chmod(runtime, 0o777)  # writable by others: not used
    assert socket_base_dir() != str(runtime)
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path / "missing"))
    assert socket_base_dir() != str(tmp_path / "missing")
    monkeypatch.setenv("XDG_RUNTIME_DIR", "/" + "x" * 120)  # too long for sun_path
    assert len(socket_base_dir()) < 70


# -- a real node agent ---------------------------------------------------------------

RANK_SCRIPT = """\
import os, sys, time
from pathlib import Path
from corral import sdk
out = Path(sys.argv[1])
(out / "token").write_text(os.environ["CORRAL_CONTROL_TOKEN"])
(out / "secret").write_text(os.environ["WANDB_API_KEY"] + " " + os.environ["DATA_URL"])
# last, and whole at once: the test reads the three files once this one exists
(out / "control.tmp").write_text(os.environ["CORRAL_CONTROL"])
(out / "control.tmp").rename(out / "control")
deadline = time.monotonic() + 60
while not (out / "go").exists():
    if time.monotonic() > deadline:
        sys.exit(7)
    time.sleep(0.02)
sdk.report(5, 10, loss=0.5)
print("rank done", flush=True)
"""
SECRETS = ("s3cret-wandb-value", "hunter2")


def _start_message(tmp_path: Path, node_dir: Path) -> dict[str, Any]:
    script = tmp_path / "rank.py"
    script.write_text(RANK_SCRIPT)
    env = {
        "CORRAL_NODE_DIR": str(node_dir),
        "CORRAL_JOB_ID": "job-1",
        "CORRAL_ATTEMPT": "0",
        "WANDB_API_KEY": SECRETS[0],  # secret by its name
        "DATA_URL": f"https://user:{SECRETS[1]}@data.example",  # secret by --secret-env
    }
    return {
        "op": "start",
        "grace": 2.0,
        "node": {
            "host": "n0",
            "address": "127.0.0.1",
            "node_rank": 0,
            "argv": [sys.executable, "-m", "corral.agent.worker", str(script), str(tmp_path)],
            "env": env,
            "cwd": str(tmp_path),
            "nproc": 1,
            "ranks": [{"rank": 0, "local_rank": 0, "env": {"RANK": "0", "WORLD_SIZE": "1"}}],
            "master_addr": "127.0.0.1",
            "master_port": 0,
            "hosts_master": False,
            "secret_env": ["DATA_URL"],
        },
    }


class AgentOutput:
    """Reads the agent's frames in a thread: the events, and every raw byte."""

    def __init__(self, stream: Any) -> None:
        self.stream = stream
        self.events: list[dict[str, Any]] = []
        self.raw = bytearray()
        self.thread = threading.Thread(target=self._read, daemon=True)
        self.thread.start()

    def _read(self) -> None:
        while header := self.stream.readline():
            kind, _rank, length = decode_header(header)
            payload = self.stream.read(length)
            self.raw += header + payload
            if kind == EVENT:
                self.events.append(json.loads(payload))

    def named(self, name: str) -> list[dict[str, Any]]:
        return [e for e in list(self.events) if e.get("event") == name]


def test_a_node_agent_serves_only_its_own_ranks(tmp_path: Path) -> None:
    node_dir = tmp_path / "node"
    agent = subprocess.Popen(
        [sys.executable, "-m", "corral.agent"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    assert agent.stdin is not None and agent.stdout is not None and agent.stderr is not None
    output = AgentOutput(agent.stdout)
    try:
        agent.stdin.write(json.dumps(_start_message(tmp_path, node_dir)).encode() + b"\n")
        agent.stdin.flush()
        _wait_for(lambda: (tmp_path / "control").exists(), "the rank to start")
        address = (tmp_path / "control").read_text()
        token = (tmp_path / "token").read_text()
        path = address.removeprefix("unix:")
        # the rank got the real secrets, a private socket and a token
        assert (
            tmp_path / "secret"
        ).read_text() == f"{SECRETS[0]} https://user:{SECRETS[1]}@data.example"
        assert len(token) == 32 and token not in address
        assert _mode(os.path.dirname(path)) == 0o700 and _mode(path) == 0o600
        # strangers' lines are refused and change nothing
        for first in (b"", b"auth " + b"0" * 32 + b"\n"):
            assert _hung_up(path, first + INTRUSION + f"out 0 0 {os.getpid()}\n".encode())
        # files in the node dir: the owner's only, secrets redacted
        assert _mode(node_dir) == 0o700
        spec_text = (node_dir / "spec.json").read_text()
        assert _mode(node_dir / "spec.json") == 0o600
        spec = json.loads(spec_text)
        assert spec["env"]["WANDB_API_KEY"] == REDACTED == spec["env"]["DATA_URL"]
        assert spec["env"]["CORRAL_JOB_ID"] == "job-1"
        assert not any(s in spec_text for s in SECRETS) and token not in spec_text
        (tmp_path / "go").touch()
        assert agent.wait(60) == 0
        output.thread.join(30)
    finally:
        if agent.poll() is None:
            agent.kill()
            agent.wait()
    stderr = agent.stderr.read()
    reports = output.named("report")
    assert [(r["rank"], r["step"], r["total"]) for r in reports] == [(0, 5, 10)]
    assert [e["pid"] != os.getpid() for e in output.named("rank_start")] == [True]
    assert [e["code"] for e in output.named("rank_exit")] == [0]
    assert b"rank done" in output.raw
    # gone with the agent
    assert not os.path.exists(os.path.dirname(path))
    # the token and the secrets are nowhere but in the rank's environment
    for leak in (token, *SECRETS):
        assert leak.encode() not in output.raw and leak.encode() not in stderr
    for file in node_dir.rglob("*"):
        if file.is_file():
            text = file.read_bytes()
            assert not any(leak.encode() in text for leak in (token, *SECRETS)), file
    written = ["spec.json", "agent.pid", "pgids", "status.json", "logs/node.log", "logs/rank-0.log"]
    assert {name: _mode(node_dir / name) for name in written} == dict.fromkeys(written, 0o600)
    assert _mode(node_dir / "logs") == 0o700 and _mode(node_dir / "errors") == 0o700


def test_the_node_dir_is_preferred_when_private_and_short(tmp_path: Path) -> None:
    node = Path(tempfile.mkdtemp(prefix="n", dir="/tmp"))  # short: fits a socket path
    try:
        os.chmod(node, 0o700)
        assert socket_base_dir(str(node)) == str(node)
        os.chmod(node, 0o777)  # writable by others: never
        assert socket_base_dir(str(node)) != str(node)
        long = "/tmp/" + "x" * 120
        assert socket_base_dir(long) != long
    finally:
        os.rmdir(node)


def test_drain_reads_connections_still_queued_when_the_ranks_are_done(tmp_path: Path) -> None:
    """A rank that sent its last report and exited before the agent accepted its
    connection: the drain at the node's end still reads every line of it."""
    calls: list[list[bytes]] = []

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        lines: list[bytes] = []
        calls.append(lines)
        while line := await reader.readline():
            lines.append(line)
        writer.close()

    async def scenario() -> None:
        server = ControlServer(handler, base_dir=str(tmp_path))
        await server.start()
        assert server.path is not None
        try:
            for _ in range(3):  # connected, sent and gone, without the loop running
                with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
                    sock.connect(server.path)
                    sock.sendall(auth_line(server.token) + b"ctl 0\n" + PROGRESS)
            await server.drain(10.0)
        finally:
            server.close()

    asyncio.run(scenario())
    assert calls == [[b"ctl 0\n", PROGRESS]] * 3
