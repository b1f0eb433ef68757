"""corral.sdk.report over a real unix socket."""

from __future__ import annotations

import contextlib
import json
import os
import resource
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from corral import sdk
from corral.sdk import _report
from corral.sdk._report import REQUEST_TIMEOUT, request
from tests.conftest import require_torch

TOKEN = "0123456789abcdef0123456789abcdef"


class ControlServer:
    """A unix stream server that collects every line each connection sends after
    its first (the ``auth`` line, kept in ``auth``)."""

    def __init__(self, address: str) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.bind(address)
        self.sock.listen(16)
        self.auth: list[str] = []
        self.connections: list[list[str]] = []
        self.sockets: list[socket.socket] = []
        self._lock = threading.Lock()
        self.accepter = threading.Thread(target=self._accept, daemon=True)
        self.accepter.start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            lines: list[str] = []
            with self._lock:
                self.connections.append(lines)
                self.sockets.append(conn)
            threading.Thread(target=self._read, args=(conn, lines), daemon=True).start()

    def _read(self, conn: socket.socket, lines: list[str]) -> None:
        try:
            with conn, conn.makefile("r", encoding="ascii") as fh:
                self.auth.append(fh.readline())
                for line in fh:
                    lines.append(line)
        except OSError:
            pass

    def wait_lines(self, n: int, timeout: float = 5.0) -> list[str]:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with self._lock:
                got = [line for conn in self.connections for line in conn]
            if len(got) >= n:
                return got
            time.sleep(0.01)
        raise AssertionError(f"expected {n} lines, got {got!r}")

    def wait_reports(self, n: int, timeout: float = 10.0) -> list[dict[str, Any]]:
        """The progress reports received, at least ``n``: each report of a ``reports``
        line on its own, as the node agent forwards them (``type``, ``rank`` added)."""
        deadline = time.monotonic() + timeout
        while True:
            with self._lock:
                got = [line for conn in self.connections for line in conn]
            found = [report for line in got if line.startswith("{") for report in expand(line)]
            if len(found) >= n or time.monotonic() >= deadline:
                assert len(found) >= n, f"expected {n} reports, got {got!r}"
                return found
            time.sleep(0.01)

    def close(self) -> None:
        """Stop listening and hang up on every client."""
        self.sock.close()
        for conn in self.sockets:
            with contextlib.suppress(OSError):  # the reader may have closed it already
                conn.shutdown(socket.SHUT_RDWR)


def expand(line: str) -> list[dict[str, Any]]:
    """The progress reports of one line the SDK sent (none for other events)."""
    message = json.loads(line)
    if message.get("type") != "reports":
        return [message] if message.get("type") == "progress" else []
    assert set(message) == {"type", "rank", "sent", "reports"}, message
    assert isinstance(message["sent"], float), message  # the ages' origin, the rank's clock
    reports = []
    for step, total, age, metrics, sections in message["reports"]:
        report = {"type": "progress", "rank": message["rank"], "step": step, "total": total}
        report.update(age=age, metrics=metrics)
        if sections is not None:  # nanoseconds on the wire, seconds as the agent forwards
            report["sections"] = {name: ns / 1e9 for name, ns in sections.items()}
        reports.append(report)
    return reports


def forget_earlier_reports(monkeypatch: pytest.MonkeyPatch) -> None:
    """Drop the reports an earlier test left in this process's reporter.

    The SDK has one reporter per process: it sends what is buffered to the
    ``CORRAL_CONTROL`` of the moment it sends (every :data:`~corral.sdk._report.FLUSH_INTERVAL`
    s, on its own thread). A test that ends before its reports went out (one whose
    agent never listened, or on a busy machine where that thread runs late) would
    otherwise hand them to the next test's server. Flushed without ``CORRAL_CONTROL``,
    they are dropped (after a send already under way ends) and reporting stops until
    the next :func:`corral.sdk.report` starts it again for the new address.
    """
    monkeypatch.delenv("CORRAL_CONTROL", raising=False)
    _report.flush_reports()


@pytest.fixture(autouse=True)
def _no_reports_across_tests(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Every test here (also those that set ``CORRAL_CONTROL`` themselves) starts and
    ends with nothing buffered."""
    forget_earlier_reports(monkeypatch)
    yield
    forget_earlier_reports(monkeypatch)


@pytest.fixture
def control_server(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[ControlServer]:
    forget_earlier_reports(monkeypatch)
    server = ControlServer(str(tmp_path / "ctl"))
    monkeypatch.setenv("CORRAL_CONTROL", f"unix:{tmp_path / 'ctl'}")
    monkeypatch.setenv("CORRAL_CONTROL_TOKEN", TOKEN)
    monkeypatch.setenv("RANK", "3")
    monkeypatch.setenv("WORLD_SIZE", "4")
    yield server
    forget_earlier_reports(monkeypatch)  # nothing of this test's goes to the next one
    server.close()


def test_handshake_then_json_lines(control_server: ControlServer) -> None:
    sdk.report(1, 10, loss=2.5, acc=0.25)
    sdk.report(2)
    _report.flush_reports()
    sdk.report(3)
    _report.flush_reports()
    lines = control_server.wait_lines(3)
    assert len(control_server.connections) == 1  # one connection, reused
    assert control_server.auth == [f"auth {TOKEN}\n"]  # the token comes first
    assert lines[0] == "ctl 3\n"
    batch = json.loads(lines[1])  # the reports made before a send go together, in order
    first, second = batch["reports"]
    assert (batch["type"], batch["rank"]) == ("reports", 3)
    # [step, total, age (ms between the call and the send), metrics, sections]
    assert first == [1, 10, first[2], {"loss": 2.5, "acc": 0.25}, None]
    assert second == [2, None, second[2], {}, None]
    assert 0 <= second[2] <= first[2] < 60_000
    assert [r[0] for r in json.loads(lines[2])["reports"]] == [3]


def test_unusual_metric_values(control_server: ControlServer) -> None:
    torch = require_torch()
    loss = torch.tensor(0.5)
    sdk.report(1, loss=loss, bad=float("nan"), big=float("inf"), n=3)
    loss += 1  # changed after the call: the report has the value at the call
    payload = control_server.wait_reports(1)[0]
    assert payload["metrics"] == {"loss": 0.5, "bad": None, "big": None, "n": 3.0}


def test_a_bad_value_drops_only_that_report(control_server: ControlServer) -> None:
    sdk.report(1, loss="not a number")  # type: ignore[arg-type]
    sdk.report("two", loss=1.0)  # type: ignore[arg-type]
    sdk.report(3, loss=1.0)
    assert [r["step"] for r in control_server.wait_reports(1)] == [3]


def test_filesystem_socket_path_without_a_token(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    path = tmp_path / "ctl.sock"
    server = ControlServer(str(path))
    monkeypatch.setenv("CORRAL_CONTROL", f"unix:{path}")
    monkeypatch.delenv("CORRAL_CONTROL_TOKEN", raising=False)
    monkeypatch.delenv("RANK", raising=False)
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    try:
        sdk.report(7, 8, loss=0.1)
        lines = server.wait_lines(2)
    finally:
        server.close()
    assert server.auth == ["auth \n"]  # an empty token: the agent refuses it
    assert lines[0] == "ctl 0\n"
    assert [r["step"] for r in expand(lines[1])] == [7]


def test_noop_without_control_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("CORRAL_CONTROL", raising=False)

    def no_socket(*args: Any, **kwargs: Any) -> socket.socket:
        raise AssertionError("report() must not open a socket without CORRAL_CONTROL")

    monkeypatch.setattr(socket, "socket", no_socket)
    sdk.report(1, 2, loss=1.0)


@pytest.mark.parametrize(
    "spec",
    [
        "unix:/nonexistent/corral-nobody-listens-here",
        "unix:@corral-nobody-listens-here",
        "tcp:127.0.0.1:1",
        "unix:",
    ],
)
def test_unreachable_or_bad_address_never_raises(
    monkeypatch: pytest.MonkeyPatch, spec: str
) -> None:
    monkeypatch.setenv("CORRAL_CONTROL", spec)
    for step in range(3):
        sdk.report(step, loss=1.0)


def test_disabled_after_first_failure(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("CORRAL_CONTROL", f"unix:{tmp_path / 'ctl'}")
    sdk.report(1)
    _report.flush_reports()  # nobody listening: reporting turns itself off
    server = ControlServer(str(tmp_path / "ctl"))
    try:
        sdk.report(2)
        _report.flush_reports()
        time.sleep(0.2)
        assert server.connections == []
    finally:
        server.close()


def test_supervisor_going_away_never_raises(control_server: ControlServer) -> None:
    sdk.report(1)
    control_server.wait_lines(2)
    control_server.close()
    for step in range(2, 200):
        sdk.report(step, loss=float(step))  # EPIPE / ECONNRESET must not escape
        _report.flush_reports()
    assert not _report._reporter.active  # reporting is off: reports are not even kept
    sdk.report(200)
    assert not _report._records


def test_a_stalled_supervisor_never_blocks_training_and_turns_reporting_off(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(str(tmp_path / "ctl"))
    listener.listen(1)  # accepts (via the backlog) but never reads
    monkeypatch.setenv("CORRAL_CONTROL", f"unix:{tmp_path / 'ctl'}")
    monkeypatch.setattr(_report, "STALL_TIMEOUT", 0.5)
    sends = _count_sends(monkeypatch)
    metrics = {f"metric_{i}": float(i) for i in range(60)}
    try:
        for step in range(3000):  # several MB: far more than the socket buffers
            sdk.report(step, None, **metrics)
        assert sends.on_thread(threading.main_thread()) == 0  # training never sent a byte
        _report.flush_reports()  # blocks on the full buffer, for STALL_TIMEOUT at most
    finally:
        listener.close()
    assert not _report._reporter.active  # the send timed out: reporting is off for good
    sdk.report(3000)
    assert not _report._records


def test_concurrent_reports_are_whole_lines(control_server: ControlServer) -> None:
    def worker(offset: int) -> None:
        for i in range(50):
            sdk.report(offset + i, loss=float(i))

    threads = [threading.Thread(target=worker, args=(k * 1000,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    reports = control_server.wait_reports(200)
    steps = sorted(r["step"] for r in reports)
    assert steps == sorted(k * 1000 + i for k in range(4) for i in range(50))
    for k in range(4):  # each thread's reports in its order
        mine = [r["step"] for r in reports if k * 1000 <= r["step"] < k * 1000 + 50]
        assert mine == sorted(mine)


def test_a_report_an_earlier_test_left_unsent_never_reaches_the_next_server(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """The cause of one report seen twice above on a busy machine: the process's one
    reporter sends its buffer to the ``CORRAL_CONTROL`` of the moment it sends, so a
    report an earlier test made (its sender thread late) went to this test's server."""
    real, quiet = _report._reporter, _report._Reporter()
    quiet._thread = threading.current_thread()  # no sender thread: it sends when flushed
    with real._flush_lock:  # the process's sender thread (it shares the buffer) waits
        monkeypatch.setattr(_report, "_reporter", quiet)
        monkeypatch.setenv("CORRAL_CONTROL", "unix:@corral-an-earlier-test-agent")
        sdk.report(1)  # the earlier test ends before this went out
        forget_earlier_reports(monkeypatch)  # what control_server does first
        server = ControlServer(str(tmp_path / "ctl"))
        monkeypatch.setenv("CORRAL_CONTROL", f"unix:{tmp_path / 'ctl'}")
        try:
            sdk.report(2)
            _report.flush_reports()
            steps = [r["step"] for r in server.wait_reports(1)]  # one line: every report
        finally:
            server.close()
    assert steps == [2]


def test_forked_child_opens_its_own_connection(control_server: ControlServer) -> None:
    sdk.report(1)
    control_server.wait_lines(2)
    sdk.report(2)  # buffered when the process forks: sent by the parent only
    pid = os.fork()
    if pid == 0:  # child
        try:
            sdk.report(100)
            _report.flush_reports()
        finally:
            os._exit(0)
    os.waitpid(pid, 0)
    sdk.report(3)
    lines = control_server.wait_lines(5)
    assert len(control_server.connections) == 2
    assert sorted(lines).count("ctl 3\n") == 2
    assert sorted(r["step"] for r in control_server.wait_reports(4)) == [1, 2, 3, 100]


SIGPIPE_SCRIPT = """
import os, signal, socket, sys
signal.signal(signal.SIGPIPE, signal.SIG_DFL)  # as some launchers leave it: SIGPIPE kills
from corral import sdk
srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
srv.bind(sys.argv[1])
srv.listen(1)
os.environ["CORRAL_CONTROL"] = "unix:" + sys.argv[1]
sdk.report(1)
conn, _ = srv.accept()
conn.close()  # the supervisor hangs up
srv.close()
for step in range(2, 50):
    sdk.report(step)
print("alive")
"""


def test_no_sigpipe_even_with_the_default_handler(tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-c", SIGPIPE_SCRIPT, str(tmp_path / "ctl")],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, (proc.returncode, proc.stderr)
    assert proc.stdout.strip() == "alive"


def _answer_when_asked(server: ControlServer, *replies: bytes, hang_up: bool = False) -> None:
    """Once the request line has arrived, send ``replies`` back on its connection."""

    def run() -> None:
        server.wait_lines(2)
        conn = server.sockets[0]
        for reply in replies:
            time.sleep(0.05)
            conn.sendall(reply)
        if hang_up:
            conn.shutdown(socket.SHUT_RDWR)

    threading.Thread(target=run, daemon=True).start()


def test_request_waits_for_the_matching_reply(control_server: ControlServer) -> None:
    _answer_when_asked(
        control_server,
        b'{"type": "replicated", "name": "ckpt-00000001.pt", "ok": true}\n',  # another one
        b'{"type": "replicated", "name": "ckpt-00000002.pt",',  # a line in two pieces
        b' "ok": false, "error": "disk full"}\n',
    )
    reply = request(
        {"type": "checkpoint", "step": 2},
        {"type": "replicated", "name": "ckpt-00000002.pt"},
        timeout=30,
    )
    assert reply == {
        "type": "replicated",
        "name": "ckpt-00000002.pt",
        "ok": False,
        "error": "disk full",
    }
    sent = json.loads(control_server.wait_lines(2)[1])
    assert (sent["type"], sent["step"], sent["ack"], sent["rank"]) == ("checkpoint", 2, True, 3)


def test_request_gives_up_when_the_agent_hangs_up(control_server: ControlServer) -> None:
    _answer_when_asked(control_server, hang_up=True)
    assert request({"type": "checkpoint"}, {"type": "replicated"}, 30) is None
    sdk.report(5)  # reporting is off for good after the connection ended; never raises
    assert len(control_server.connections) == 1


def test_request_times_out_and_is_a_noop_outside_corral(
    control_server: ControlServer,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    started = time.monotonic()
    assert request({"type": "checkpoint"}, {"type": "replicated"}, 0.3) is None
    assert time.monotonic() - started >= 0.3
    assert capsys.readouterr().err == (
        "corral: warning: no answer to checkpoint from the coordinator within 0.3 s; "
        "going on without it\n"
    )
    monkeypatch.delenv("CORRAL_CONTROL")
    assert request({"type": "checkpoint"}, {"type": "replicated"}) is None
    assert capsys.readouterr().err == ""  # outside corral: at once, nothing to warn about


def test_request_never_waits_past_its_default_timeout(
    control_server: ControlServer,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    ticks = iter([0.0, REQUEST_TIMEOUT - 0.5])  # then: the deadline has passed
    monkeypatch.setattr(_report, "_monotonic", lambda: next(ticks, REQUEST_TIMEOUT + 1.0))
    assert request({"type": "checkpoint"}, {"type": "replicated"}) is None  # nobody answers
    assert f"within {REQUEST_TIMEOUT:g} s" in capsys.readouterr().err
    assert control_server.wait_lines(2)[0] == "ctl 3\n"  # it did ask, then gave up


@pytest.fixture
def low_fds_taken() -> Iterator[None]:
    """Every fd below 1100 in use, so the SDK's next socket gets a number >= 1024."""
    _report._reporter._reset("")  # frees an earlier test's connection (a low fd) now
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < 2048:
        resource.setrlimit(resource.RLIMIT_NOFILE, (2048, max(hard, 2048)))
    taken: list[int] = []
    try:
        while not taken or taken[-1] < 1100:
            taken.append(os.open(os.devnull, os.O_RDONLY))
        yield
    finally:
        for fd in taken:
            os.close(fd)
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def test_request_on_a_socket_fd_above_1024(
    control_server: ControlServer, low_fds_taken: None
) -> None:
    _answer_when_asked(control_server, b'{"type": "replicated", "name": "c.pt", "ok": true}\n')
    reply = request({"type": "checkpoint"}, {"type": "replicated", "name": "c.pt"}, timeout=30)
    assert _report._reporter._sock is not None and _report._reporter._sock.fileno() >= 1024
    assert reply == {"type": "replicated", "name": "c.pt", "ok": True}


def test_a_replicated_save_waits_for_the_answer_and_warns_when_not_copied(
    control_server: ControlServer,
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    require_torch()
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("CORRAL_CHECKPOINT_REPLICA", "wait")
    _answer_when_asked(
        control_server,
        b'{"type": "replicated", "name": "ckpt-00000007.pt", "ok": false, '
        b'"error": "cannot write it here: no space left on device"}\n',
    )
    saved = sdk.save_checkpoint({"step": 7}, tmp_path, 7)
    assert saved == tmp_path / "ckpt-00000007.pt" and saved.is_file()
    announced = json.loads(control_server.wait_lines(2)[1])
    assert announced["ack"] is True and announced["path"] == str(saved)
    assert capsys.readouterr().err == (
        "corral: warning: ckpt-00000007.pt is not in the coordinator's replica (cannot write "
        "it here: no space left on device); it exists on this host only\n"
    )


# -- buffered reports: cheap per call, nothing lost ---------------------------------------


class _Sends:
    """The thread of every ``socket.sendall`` call."""

    def __init__(self) -> None:
        self.threads: list[threading.Thread] = []

    def on_thread(self, thread: threading.Thread) -> int:
        return sum(1 for t in self.threads if t is thread)


def _count_sends(monkeypatch: pytest.MonkeyPatch) -> _Sends:
    sends = _Sends()
    real_sendall, real_send = socket.socket.sendall, socket.socket.send

    def sendall(sock: socket.socket, data: Any, *args: Any) -> None:
        sends.threads.append(threading.current_thread())
        real_sendall(sock, data, *args)

    def send(sock: socket.socket, data: Any, *args: Any) -> int:
        sends.threads.append(threading.current_thread())
        return real_send(sock, data, *args)

    monkeypatch.setattr(socket.socket, "sendall", sendall)
    monkeypatch.setattr(socket.socket, "send", send)
    return sends


def test_reports_are_sent_in_batches_by_another_thread(
    control_server: ControlServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    sends = _count_sends(monkeypatch)
    for step in range(1, 1001):
        with sdk.section("compute"):
            pass
        sdk.report(step, 1000, loss=float(step))
    assert sends.on_thread(threading.main_thread()) == 0  # no syscall in the training loop
    reports = control_server.wait_reports(1000)
    assert [r["step"] for r in reports] == list(range(1, 1001))  # every one, in order
    assert [r["metrics"]["loss"] for r in reports] == [float(s) for s in range(1, 1001)]
    assert all(set(r["sections"]) == {"compute"} for r in reports)  # each its own step's
    assert len(sends.threads) < 100  # a few lines of many reports, not a line each


def test_a_report_arrives_while_the_training_thread_blocks(
    control_server: ControlServer,
) -> None:
    sdk.report(41)
    sdk.report(42)  # then no SDK call at all: the rank is stuck (a hang)
    assert [r["step"] for r in control_server.wait_reports(2)] == [41, 42]


def test_an_event_goes_after_the_reports_made_before_it(control_server: ControlServer) -> None:
    for step in range(1, 6):
        sdk.report(step)
    _report.send_event({"type": "checkpoint", "step": 5, "path": "/ckpt/5.pt"})
    lines = control_server.wait_lines(3)
    assert [r["step"] for r in expand(lines[1])] == [1, 2, 3, 4, 5]
    assert json.loads(lines[2])["type"] == "checkpoint"


def test_long_batches_are_split_into_lines_the_agent_accepts(
    control_server: ControlServer,
) -> None:
    metrics = {f"metric_{i:02d}": float(i) for i in range(60)}  # ~1.4 KB a report
    for step in range(300):
        sdk.report(step, **metrics)
    _report.flush_reports()
    reports = control_server.wait_reports(300)
    assert [r["step"] for r in reports] == list(range(300))
    lines = control_server.wait_lines(2)[1:]
    assert len(lines) > 1 and all(len(line.encode()) <= _report.MAX_LINE for line in lines)


EXIT_SCRIPT = """
import sys
from corral import sdk
with sdk.section("compute"):
    pass
for step in range(1, 301):
    sdk.report(step)
if sys.argv[1] == "crash":
    raise RuntimeError("boom")
"""


@pytest.mark.parametrize("how", ["exit", "crash"])
def test_the_last_reports_are_sent_at_exit(control_server: ControlServer, how: str) -> None:
    proc = subprocess.run(
        [sys.executable, "-c", EXIT_SCRIPT, how],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == (1 if how == "crash" else 0), proc.stderr
    reports = control_server.wait_reports(300)
    assert [r["step"] for r in reports] == list(range(1, 301))
    assert "compute" in reports[0]["sections"]


MP_SCRIPT = """
import multiprocessing, sys
from corral import sdk

def rank(first):
    for step in range(first, first + 100):
        sdk.report(step)  # then the child leaves with os._exit: no atexit

if __name__ == "__main__":
    ctx = multiprocessing.get_context(sys.argv[1])
    children = [ctx.Process(target=rank, args=(k * 1000,)) for k in range(2)]
    for child in children:
        child.start()
    for child in children:
        child.join()
"""


@pytest.mark.parametrize("method", ["fork", "spawn"])
def test_a_multiprocessing_child_sends_its_last_reports(
    control_server: ControlServer, tmp_path: Path, method: str
) -> None:
    script = tmp_path / "mp.py"
    script.write_text(MP_SCRIPT)
    proc = subprocess.run(
        [sys.executable, str(script), method], capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stderr
    steps = sorted(r["step"] for r in control_server.wait_reports(200))
    assert steps == list(range(100)) + list(range(1000, 1100))


def test_a_slow_agent_gets_every_report(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """An agent that reads slowly (its coordinator is busy) delays the reports; only
    one that reads nothing for STALL_TIMEOUT turns reporting off."""
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(str(tmp_path / "ctl"))
    listener.listen(1)
    monkeypatch.setenv("CORRAL_CONTROL", f"unix:{tmp_path / 'ctl'}")
    monkeypatch.setattr(_report, "STALL_TIMEOUT", 5.0)
    received = bytearray()

    def read_slowly() -> None:  # 16 KB every 0.4 s: a line of 60 KB takes seconds
        conn, _ = listener.accept()
        with conn:
            while chunk := conn.recv(16384):
                received.extend(chunk)
                time.sleep(0.4)

    reader = threading.Thread(target=read_slowly, daemon=True)
    reader.start()
    metrics = {f"metric_{i:02d}": 1.0 / (i + 3) for i in range(20)}  # ~500 B a report
    try:
        for step in range(800):  # ~400 KB: more than the socket buffers
            sdk.report(step, **metrics)
        _report.flush_reports()
        assert _report._reporter.active  # slow is not stuck
        _report._reporter._reset("")  # hang up: the reader sees the end
        reader.join(timeout=60)
    finally:
        listener.close()
    lines = bytes(received).decode().splitlines()[2:]  # after auth and ctl
    steps = [r["step"] for line in lines for r in expand(line)]
    assert steps == list(range(800))
