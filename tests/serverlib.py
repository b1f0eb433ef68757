"""A real ``corral serve`` for tests and benchmarks: a subprocess on a free port.

It runs as its own process so a test can SIGKILL it mid-job and start it again
on the same store and run dir (the re-attach case).
"""

from __future__ import annotations

import functools
import os
import signal
import socket
import ssl
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import httpx

TOKEN = "test-token-" + "Xq7vB2mK9pLw4RzT8nYc3HdF6sJe1GaU5"  # strong enough for corral serve
#: A wait's polls: the first after ``POLL_FIRST_S``, each later one 1.5 times later, at
#: most ``POLL_MAX_S`` apart (a status read costs the server ~5 ms of CPU; issue 30).
POLL_FIRST_S = 0.05
POLL_MAX_S = 0.5


@functools.cache
def tls_context() -> ssl.SSLContext:
    """One TLS context for every client of the process: httpx builds a new one for
    each client otherwise (~30 ms of CPU, loading the CA bundle), which the plain
    HTTP of these servers never uses."""
    return ssl.create_default_context()


def polls(timeout: float) -> Iterator[float]:
    """Sleep between polls, ever longer up to ``POLL_MAX_S``, until ``timeout`` s have
    passed; yields the seconds left before each poll (the first right away)."""
    deadline = time.monotonic() + timeout
    pause = POLL_FIRST_S
    while (left := deadline - time.monotonic()) > 0:
        yield left
        time.sleep(min(pause, max(deadline - time.monotonic(), 0)))
        pause = min(pause * 1.5, POLL_MAX_S)


def free_port() -> int:
    """A TCP port free on 127.0.0.1 right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class LiveServer:
    """One ``corral serve`` process and how to reach it."""

    root: Path
    db_url: str
    args: Sequence[str] = ()
    env: dict[str, str] = field(default_factory=dict)
    port: int = 0
    proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def token_file(self) -> Path:
        return self.root / "token"

    @property
    def run_dir(self) -> Path:
        return self.root / "runs"

    def client(self, timeout: float = 60.0) -> httpx.Client:
        """An authenticated client."""
        return httpx.Client(
            base_url=self.url,
            timeout=timeout,
            headers={"Authorization": f"Bearer {TOKEN}"},
            verify=tls_context(),
        )

    def start(self, timeout: float = 60.0) -> LiveServer:
        """Start the server (a fresh port each time) and wait until it answers."""
        self.token_file.write_text(TOKEN + "\n")
        self.token_file.chmod(0o600)
        self.port = free_port()
        log = open(self.root / "serve.log", "ab")  # noqa: SIM115 - the child keeps it
        self.proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "corral",
                "serve",
                "--port",
                str(self.port),
                "--db",
                self.db_url,
                "--run-dir",
                str(self.run_dir),
                "--token-file",
                str(self.token_file),
                *self.args,
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
            env={**os.environ, **self.env},
            cwd=self.root,
        )
        log.close()
        with httpx.Client(timeout=2, verify=tls_context()) as probe:
            for _ in polls(timeout):
                if self.proc.poll() is not None:
                    raise RuntimeError(f"corral serve exited {self.proc.returncode}: {self.log()}")
                try:
                    if probe.get(f"{self.url}/healthz").status_code == 200:
                        return self
                except httpx.HTTPError:
                    pass
        raise RuntimeError(f"corral serve did not answer within {timeout} s: {self.log()}")

    def kill(self) -> None:
        """SIGKILL the server (its jobs' supervisors live on)."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(10)

    def stop(self) -> None:
        """Stop the server the normal way."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)

    def log(self) -> str:
        """The server's own output so far."""
        try:
            return (self.root / "serve.log").read_text(errors="replace")[-4000:]
        except OSError:
            return ""


@contextmanager
def live_server(
    root: Path,
    db_url: str | None = None,
    args: Sequence[str] = (),
    env: dict[str, str] | None = None,
) -> Iterator[LiveServer]:
    """A started server in ``root`` (SQLite there unless ``db_url``), stopped after."""
    root.mkdir(parents=True, exist_ok=True)
    server = LiveServer(root, db_url or f"sqlite:///{root / 'corral.db'}", args, env or {})
    server.start()
    try:
        yield server
    finally:
        server.stop()


def wait_status(
    client: httpx.Client, job_id: str, states: Sequence[str], timeout: float = 120.0
) -> dict[str, object]:
    """Poll a job's status until it is in one of ``states``; the status."""
    last: dict[str, object] = {}
    for _ in polls(timeout):
        last = client.get(f"/api/network/distributed/status/{job_id}").json()
        if last.get("status") in states:
            return last
    raise AssertionError(f"job {job_id} not in {states} within {timeout} s: {last}")


def follow_events(
    client: httpx.Client, job_id: str, timeout: float = 180.0
) -> list[tuple[str, str, str]]:
    """Read the job's SSE stream to its end: (id, event, data) triples."""
    events: list[tuple[str, str, str]] = []
    current: dict[str, str] = {}
    with client.stream("GET", f"/api/jobs/{job_id}/events", timeout=timeout) as resp:
        resp.raise_for_status()
        for line in resp.iter_lines():
            if not line:
                if "data" in current:
                    events.append(
                        (current.get("id", ""), current.get("event", "message"), current["data"])
                    )
                current = {}
                continue
            if line.startswith(":"):
                continue
            key, _, value = line.partition(":")
            current[key] = value[1:] if value.startswith(" ") else value
    return events
