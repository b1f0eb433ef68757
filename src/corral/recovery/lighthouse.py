"""torchft's Lighthouse as a child process of the coordinator (``--recovery in-place``).

:meth:`Lighthouse.start` runs ``python -m corral.recovery.lighthouse`` (this
module's :func:`main`: a :class:`torchft.coordination.LighthouseServer` bound to
the address the hosts reach, with ``min_replicas`` from ``--min-nodes`` and its join
timeout from ``--ft-join-timeout``), reads
the port it bound and hands out ``http://ADDRESS:PORT`` (torchft's
``TORCHFT_LIGHTHOUSE``). The child dies with the coordinator (stdin EOF, and
PR_SET_PDEATHSIG on Linux), so it is never an orphan; :meth:`Lighthouse.close`
ends it. Its exit while the attempt runs is how the supervisor learns the
Lighthouse is gone: it starts a new one at the same address and port
(:meth:`Lighthouse.restart`), to which the groups' torchft Managers reconnect (their
quorum retries, ``TORCHFT_QUORUM_RETRIES``), or, when it cannot, falls back to a
restart from the disk checkpoint.
:meth:`Lighthouse.members` reads which Managers have heartbeated it (how the
supervisor learns that every group joined the quorum).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import ipaddress
import json
import os
import re
import signal
import socket
import sys
from typing import Any

from corral.contract import JOB_ID_ENV
from corral.defaults import DEFAULT_FT_JOIN_TIMEOUT
from corral.errors import LaunchError

START_TIMEOUT = 30.0
# When a replica group is lost, the survivors' next quorum is issued once the lost
# group's last heartbeat is HEARTBEAT_TIMEOUT_MS old, or the join timeout after the
# first survivor asked for it, whichever comes first (torchft's quorum_compute; with no
# change in membership its "fast quorum" waits for neither). That wait is most of the
# survivors' gap after a fault (2.2 s of it with 2000/5000 ms; bench_inplace.py).
# The join timeout (``--ft-join-timeout``, the job's: DEFAULT_FT_JOIN_TIMEOUT) is how
# long a changed quorum waits for heartbeating stragglers. It must exceed the job's
# step time: a live group left out of a quorum asks for the next one alone, a step
# before the others, and with a wait shorter than a step each gets a quorum of its
# own, healing from the other at every step and never training together again (seen
# with 3 groups and 1 s steps at 500 ms). A lost group's heartbeat goes stale after
# HEARTBEAT_TIMEOUT_MS, so this wait never delays the survivors of a dead group, only
# of a live one that stopped stepping (a hang, which corral's hang watch tears down).
# torchft's default is 60 s; 10 s keeps the timeouts' order (corral.checks.timeouts)
# with the SDK's default quorum timeout.
#: A group whose Manager has not heartbeated for this long is lost. torchft's Manager
#: heartbeats every 100 ms from its own (Rust) thread, so this is 5 missed heartbeats.
#: It decides the survivors' wait after a group died (its Manager with it): the join
#: timeout, longer than a step, waits for live groups only. A group whose heartbeat
#: is late by more than this misses one step and heals at the next.
HEARTBEAT_TIMEOUT_MS = 500
#: How often the Lighthouse re-checks a pending quorum (torchft's default is 100 ms):
#: the lag between a timeout above running out and the quorum being issued.
QUORUM_TICK_MS = 50
STATUS_TIMEOUT = 5.0
RESTART_TRIES = 5
RESTART_PAUSE = 1.0
# the Lighthouse's status page lists every replica that heartbeated: "<id>: seen 1.2s ago"
_MEMBER = re.compile(r"^\s*([^\s<>]+): seen ", re.M)


def parse_members(page: str) -> set[str]:
    """The replica ids on the Lighthouse's ``/status`` page (every Manager that
    heartbeated it)."""
    return set(_MEMBER.findall(page))


def reachable_address(peer: str) -> str | None:
    """This machine's address on the route to ``peer`` (what a host uses to reach the
    coordinator): a UDP socket's local address after ``connect`` (no packet is sent);
    None when ``peer`` does not resolve here or no route leads to it."""
    try:
        infos = socket.getaddrinfo(peer, 9, type=socket.SOCK_DGRAM)
    except OSError:
        return None
    for family, kind, proto, _, addr in infos:
        with contextlib.suppress(OSError), socket.socket(family, kind, proto) as sock:
            sock.connect(addr)
            return str(sock.getsockname()[0])
    return None


def join_ms(seconds: float) -> int:
    """A join timeout in whole milliseconds, as the Lighthouse takes it (at least 1)."""
    return max(1, round(seconds * 1000))


def url(address: str, port: int) -> str:
    """``http://address:port`` (IPv6 literals bracketed)."""
    with contextlib.suppress(ValueError):
        if ipaddress.ip_address(address).version == 6:
            address = f"[{address}]"
    return f"http://{address}:{port}"


class Lighthouse:
    """The running Lighthouse child: its address and its process."""

    def __init__(
        self,
        proc: asyncio.subprocess.Process,
        address: str,
        port: int,
        *,
        python: str = sys.executable,
        min_replicas: int = 1,
        job_id: str = "",
        join_timeout: float = DEFAULT_FT_JOIN_TIMEOUT,
    ) -> None:
        self.proc = proc
        self.address = address
        self.port = port
        self.restarts = 0  # how many times :meth:`restart` brought it back
        self.join_timeout = join_timeout  # seconds (``--ft-join-timeout``)
        self._how = (python, min_replicas, job_id)
        self._drain: asyncio.Future[None] | None = None

    @property
    def url(self) -> str:
        """What every group's ``TORCHFT_LIGHTHOUSE`` is."""
        return url(self.address, self.port)

    @property
    def alive(self) -> bool:
        """The child has not exited."""
        return self.proc.returncode is None

    @classmethod
    async def start(
        cls,
        python: str,
        address: str,
        min_replicas: int,
        *,
        port: int = 0,
        job_id: str = "",
        join_timeout: float = DEFAULT_FT_JOIN_TIMEOUT,
    ) -> Lighthouse:
        """Start the Lighthouse bound to ``address`` (``port`` 0: a free one) and wait
        for it to listen (LaunchError if it cannot: torchft missing, address taken).
        ``CORRAL_JOB_ID=job_id`` marks it as the job's process (as the ranks are);
        ``join_timeout``: seconds a changed quorum waits for heartbeating groups."""
        proc, bound = await _spawn(python, address, min_replicas, port, job_id, join_timeout)
        lighthouse = cls(
            proc,
            address,
            bound,
            python=python,
            min_replicas=min_replicas,
            job_id=job_id,
            join_timeout=join_timeout,
        )
        lighthouse._drained()
        return lighthouse

    async def restart(self) -> None:
        """Start a new child at the same address and port, after this one exited (the
        groups' torchft Managers reconnect to it: their quorum retries,
        ``TORCHFT_QUORUM_RETRIES``). LaunchError when it cannot start (the port was
        taken meanwhile, torchft is gone)."""
        python, min_replicas, job_id = self._how
        await self.close()
        error: LaunchError | None = None
        for _ in range(RESTART_TRIES):  # the old socket's port may take a moment
            try:
                self.proc, _ = await _spawn(
                    python, self.address, min_replicas, self.port, job_id, self.join_timeout
                )
            except LaunchError as exc:
                error = exc
                await asyncio.sleep(RESTART_PAUSE)
                continue
            self.restarts += 1
            self._drained()
            return
        assert error is not None
        raise error

    def _drained(self) -> None:
        # torchft logs every quorum tick on stderr: drained, never shown
        assert self.proc.stderr is not None
        self._drain = asyncio.ensure_future(_drain(self.proc.stderr))

    async def members(self) -> set[str] | None:
        """The replica ids of every torchft Manager that has heartbeated this
        Lighthouse (its ``/status`` page); None when the page cannot be read."""
        import urllib.request  # here: the pre-flight's timeouts check imports this module

        opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))

        def read() -> str:
            with opener.open(f"{self.url}/status", timeout=STATUS_TIMEOUT) as answer:
                return bytes(answer.read()).decode("utf-8", "replace")

        try:
            return parse_members(await asyncio.to_thread(read))
        except (OSError, ValueError):
            return None

    async def wait(self) -> int:
        """Until the child exits; its exit code."""
        return await self.proc.wait()

    async def close(self) -> None:
        """End the child (SIGTERM, SIGKILL after 5 s) and wait for it."""
        if self.proc.returncode is None:
            if self.proc.stdin is not None:
                self.proc.stdin.close()
            with contextlib.suppress(ProcessLookupError):
                self.proc.terminate()
            try:
                await asyncio.wait_for(self.proc.wait(), 5.0)
            except asyncio.TimeoutError:
                with contextlib.suppress(ProcessLookupError):
                    self.proc.kill()
                await self.proc.wait()
        if self._drain is not None:
            self._drain.cancel()
            await asyncio.gather(self._drain, return_exceptions=True)


def child_argv(
    python: str, address: str, min_replicas: int, port: int, join_timeout: float
) -> list[str]:
    """The command line of the Lighthouse child (this module's :func:`main`)."""
    return [
        python,
        "-m",
        "corral.recovery.lighthouse",
        "--bind",
        f"{address}:{port}" if ":" not in address else f"[{address}]:{port}",
        "--min-replicas",
        str(min_replicas),
        "--join-timeout-ms",
        str(join_ms(join_timeout)),
    ]


async def _spawn(
    python: str, address: str, min_replicas: int, port: int, job_id: str, join_timeout: float
) -> tuple[asyncio.subprocess.Process, int]:
    """The Lighthouse child bound to ``address:port``, and the port it bound."""
    env = {**os.environ, JOB_ID_ENV: job_id} if job_id else None
    proc = await asyncio.create_subprocess_exec(
        *child_argv(python, address, min_replicas, port, join_timeout),
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env=env,
    )
    assert proc.stdout is not None and proc.stderr is not None
    try:
        line = await asyncio.wait_for(proc.stdout.readline(), START_TIMEOUT)
    except asyncio.TimeoutError:
        line = b""
    try:
        bound = int(json.loads(line)["port"])
    except (ValueError, KeyError, TypeError):
        with contextlib.suppress(ProcessLookupError):
            proc.kill()
        err = (await proc.stderr.read()).decode(errors="replace").strip().splitlines()
        await proc.wait()
        tail = err[-1] if err else f"exit {proc.returncode}"
        if "No module named 'torchft'" in "\n".join(err):
            tail = "torchft is not installed here (python -m pip install torchft-nightly)"
        raise LaunchError(f"could not start torchft's Lighthouse: {tail}") from None
    return proc, bound


async def _drain(stream: asyncio.StreamReader) -> None:
    while await stream.read(1 << 16):
        pass


def _die_with_parent() -> None:
    if sys.platform.startswith("linux"):
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGKILL, 0, 0, 0)  # PR_SET_PDEATHSIG


def _lighthouse_server_class() -> Any:
    """torchft's ``LighthouseServer``, from its native extension alone where it can be
    found: ``import torchft`` runs the package's ``__init__``, which imports torch and
    the Manager (~1.8 CPU-s, every in-place job's start) for a server written in Rust
    that needs none of it (loaded this way: ~1 ms). Elsewhere (another layout of
    torchft) the public ``torchft.coordination`` import."""
    import importlib.machinery
    import importlib.util

    with contextlib.suppress(ImportError, ValueError):
        spec = importlib.util.find_spec("torchft")  # finds the package, runs nothing
        for where in (spec.submodule_search_locations or []) if spec else []:
            for suffix in importlib.machinery.EXTENSION_SUFFIXES:
                path = os.path.join(where, "_torchft" + suffix)
                if os.path.exists(path):
                    native = importlib.util.spec_from_file_location("torchft._torchft", path)
                    if native is not None and native.loader is not None:
                        module = importlib.util.module_from_spec(native)
                        native.loader.exec_module(module)
                        return module.LighthouseServer
    from torchft.coordination import LighthouseServer

    return LighthouseServer


def main(argv: list[str] | None = None) -> int:
    """The child: serve the Lighthouse until stdin closes or SIGTERM."""
    parser = argparse.ArgumentParser(prog="python -m corral.recovery.lighthouse")
    parser.add_argument("--bind", required=True)
    parser.add_argument("--min-replicas", type=int, required=True)
    parser.add_argument("--join-timeout-ms", type=int, default=join_ms(DEFAULT_FT_JOIN_TIMEOUT))
    args = parser.parse_args(argv)
    if args.join_timeout_ms < 1:
        parser.error(f"--join-timeout-ms must be at least 1 (got {args.join_timeout_ms})")
    _die_with_parent()
    server = _lighthouse_server_class()(
        bind=args.bind,
        min_replicas=args.min_replicas,
        join_timeout_ms=args.join_timeout_ms,
        quorum_tick_ms=QUORUM_TICK_MS,
        heartbeat_timeout_ms=HEARTBEAT_TIMEOUT_MS,
    )
    port = int(server.address().rsplit(":", 1)[1])
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    print(json.dumps({"port": port}), flush=True)
    try:
        sys.stdin.read()  # until the coordinator closes it (or dies)
    finally:
        server.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
