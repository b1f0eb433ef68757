"""Pre-flight check "collective": a short all-reduce across every host and rank.

It runs the job's real communication path once, under a hard deadline, before
anything is launched: every rank joins a rendezvous store on the master, the
process group comes up with the job's backend (``gloo``; ``nccl`` where every
rank has a GPU), and a few all-reduces of a ~4 MiB float32 buffer are timed.
It passes with the measured bus bandwidth, or fails naming the host(s) that
never joined and why.

Two sides live here:

* **Host side**, ``python -m corral.checks.smoke`` (needs corral and torch on
  the host, like the job). The coordinator starts one *runner* per host and
  sends its arguments as one JSON line on stdin (or, for a manual run, as the
  only argv item). The runner starts one *worker* per rank of the host (this
  module again, ``--worker JSON``, same interpreter) and kills them at the
  deadline, when its stdin closes (the coordinator went away) or on
  SIGTERM/SIGHUP; workers also die with the runner (``PR_SET_PDEATHSIG``).
  Rank 0 serves a ``TCPStore`` on the master port; every rank sets
  ``corral/joined/<rank>`` to its host name and waits until all have joined.
  At the deadline rank 0 names the ranks without a ``joined`` key and their
  hosts. Once all joined: ``init_process_group`` with the remaining time as
  timeout, a checked warm-up all-reduce (sum of ``rank + 1``), ``iterations``
  timed ones measured on rank 0, a result check, ``destroy_process_group``.
  Everything is reported as one JSON object per line on stdout (``runner``,
  ``joined``, ``never_joined``, ``result``, ``error``, ``worker_exit``,
  ``killed``); the runner exits with the worst worker code.

* **Coordinator side**, :func:`smoke_test`: starts every runner through the
  transport in parallel, reads their events and returns a
  :class:`~corral.checks.result.CheckResult` named ``collective``. A host
  whose start fails (unreachable, auth, no interpreter, no corral) counts as
  never joined and stops the test at once; after ``deadline`` plus a small
  margin every runner is closed, signalled and waited for, so nothing stays.

Launchers that need no torch (``mlx``): the test runs torch.distributed, so on
such a job it runs only where every host has torch; otherwise
:func:`skipped_without_torch` turns it into a warning naming the hosts without
torch (MLX's own group is checked by every rank before its script runs, with a
timeout: see docs/launchers.md).

Bandwidth follows the NCCL-tests convention: ``algbw = bytes / time`` of one
all-reduce, ``busbw = algbw * 2 (n - 1) / n`` for ``n`` ranks.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from corral.checks.joinwindow import RunnerFacts, host_cap, join_window, late_summary
from corral.checks.result import CheckResult, HostCheck, Status
from corral.errors import CorralError, TransportError
from corral.remote.python import candidates

if TYPE_CHECKING:
    from corral.checks.context import CheckContext
    from corral.cluster.model import Host
    from corral.transport.base import NodeProcess, Transport

__all__ = [
    "CHECK_NAME",
    "TORCHLESS_LAUNCHERS",
    "runner_argv",
    "skipped_without_torch",
    "smoke_test",
]

CHECK_NAME = "collective"
MODULE = "corral.checks.smoke"
#: Launchers whose jobs do not need torch (the smoke test does).
TORCHLESS_LAUNCHERS = ("mlx",)

#: The coordinator waits this long past the deadline for the runners' reports.
MARGIN = 5.0
#: A runner kills its workers this long after the deadline (rank 0 reports first).
RUNNER_GRACE = 3.0
#: Ranks other than 0 wait this much longer for the others, so rank 0 names who is missing.
JOIN_SLACK = 1.0
#: After SIGTERM, how long before SIGKILL (runner -> workers, coordinator -> runners).
KILL_GRACE = 2.0
#: Exit codes of workers and runners.
EXIT_FAILED = 3
EXIT_DEADLINE = 124
#: Late hosts named one by one in the error; more are counted (joinwindow.late_summary).
SHOWN_LATE = 3
#: Error kinds that do not blame the reporting rank's host (it only waited for others).
WAITING = "waiting"

_MAX_MESSAGE = 1500
_POLL = 0.05
_TAIL_LINES = 20

_SHELL = (
    'for p in "$@"; do if command -v "$p" >/dev/null 2>&1; then exec "$p" -m '
    + MODULE
    + '; fi; done; echo "no python interpreter found (tried: $*)" >&2; exit 127'
)


# =========================================================================== host side


def _emit(event: dict[str, Any]) -> None:
    """Write one JSON line to fd 1 in one ``write`` (lines of workers sharing the
    runner's stdout never interleave: each is far below PIPE_BUF)."""
    if isinstance(event.get("message"), str) and len(event["message"]) > _MAX_MESSAGE:
        event["message"] = event["message"][:_MAX_MESSAGE] + "..."
    data = (json.dumps(event, separators=(",", ":")) + "\n").encode()
    with contextlib.suppress(OSError):
        os.write(1, data)


def _short(exc: BaseException) -> str:
    """An exception in one line, without torch's C++ stack dump."""
    text = str(exc).split("Exception raised from", 1)[0].strip()
    first = " ".join(line.strip() for line in text.splitlines()[:3] if line.strip())
    return f"{type(exc).__name__}: {first}" if first else type(exc).__name__


class _Failed(Exception):
    """A worker's expected failure: reported as an ``error`` event with ``kind``."""

    def __init__(self, kind: str, message: str) -> None:
        super().__init__(message)
        self.kind = kind
        self.message = message


def _die_with_parent(parent: int) -> None:
    if sys.platform.startswith("linux"):
        import ctypes

        with contextlib.suppress(OSError, AttributeError):
            ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL, 0, 0, 0)  # PDEATHSIG
    if os.getppid() != parent:  # the runner died before prctl took effect
        os._exit(1)


def _exit_when_stdin_closes() -> None:
    """The runner keeps our stdin open; EOF means it is gone (any platform)."""

    def watch() -> None:
        with contextlib.suppress(OSError, ValueError):
            while sys.stdin.buffer.read(4096):
                pass
        os._exit(1)

    threading.Thread(target=watch, name="stdin-watch", daemon=True).start()


def _wait_for_tcp(addr: str, port: int, until: float) -> None:
    """Poll until ``addr:port`` accepts a connection (quiet, unlike TCPStore's retries)."""
    import socket

    last = "no attempt"
    delay = 0.05
    while True:
        left = until - time.monotonic()
        if left <= 0:
            raise _Failed(
                "connect",
                f"could not reach the master's store at {addr}:{port} ({last}); check the route "
                "and firewall between this host and the master",
            )
        try:
            with socket.create_connection((addr, port), timeout=min(left, 2.0)):
                return
        except OSError as exc:
            last = exc.strerror or str(exc)
        time.sleep(min(delay, max(0.0, until - time.monotonic())))
        delay = min(delay * 2, 0.5)


def _open_store(args: Mapping[str, Any], dist: Any) -> Any:
    rank: int = args["rank"]
    addr: str = args["master_addr"]
    port: int = args["port"]
    deadline: float = args["deadline"]
    timeout = timedelta(seconds=max(deadline + JOIN_SLACK - time.monotonic(), 1.0))
    if rank == 0:
        try:
            return dist.TCPStore(
                addr, port, is_master=True, wait_for_workers=False, timeout=timeout
            )
        except Exception as exc:
            text = _short(exc)
            if "EADDRINUSE" in text or "in use" in text:
                text = (
                    f"master port {port} is already in use on this host; pick a free "
                    "--master-port (0 picks one)"
                )
            else:
                text = f"cannot serve the rendezvous store on port {port}: {text}"
            raise _Failed("store", text) from exc
    _wait_for_tcp(addr, port, deadline + JOIN_SLACK)
    try:
        return dist.TCPStore(addr, port, is_master=False, timeout=timeout)
    except Exception as exc:
        raise _Failed(
            "connect", f"could not join the master's store at {addr}:{port}: {_short(exc)}"
        ) from exc


def _has_gpu(torch: Any, local_rank: int) -> bool:
    try:
        return bool(torch.cuda.is_available()) and int(torch.cuda.device_count()) > local_rank
    except Exception:
        return False


def _join(args: Mapping[str, Any], store: Any, gpu: bool) -> None:
    """Announce this rank and wait until every rank has (rank 0 names who did not)."""
    rank: int = args["rank"]
    world: int = args["world_size"]
    try:
        store.set(f"corral/gpu/{rank}", "1" if gpu else "0")
        store.set(f"corral/joined/{rank}", args["host"])
        store.add("corral/joined", 1)
    except Exception as exc:
        raise _Failed("connect", f"lost the master's store while joining: {_short(exc)}") from exc
    _emit({"event": "joined", "rank": rank, "host": args["host"], "import_s": args.get("import_s")})
    give_up = args["deadline"] + (0.0 if rank == 0 else JOIN_SLACK)
    while True:
        try:
            count = int(store.add("corral/joined", 0))
        except Exception as exc:
            raise _Failed(WAITING, f"lost the master's store while waiting: {_short(exc)}") from exc
        if count >= world:
            return
        if time.monotonic() >= give_up:
            break
        time.sleep(_POLL)
    if rank != 0:
        raise _Failed(WAITING, f"only {count} of {world} ranks joined before the deadline")
    missing = [r for r in range(world) if not store.check([f"corral/joined/{r}"])]
    rank_hosts: list[str] = args.get("rank_hosts") or []
    hosts = list(dict.fromkeys(rank_hosts[r] for r in missing if r < len(rank_hosts)))
    _emit(
        {
            "event": "never_joined",
            "ranks": missing,
            "hosts": hosts,
            "joined": count,
            "world_size": world,
        }
    )
    raise _Failed(WAITING, f"{len(missing)} of {world} ranks never joined")


def _pick_backend(args: Mapping[str, Any], store: Any) -> str:
    """Rank 0 decides (``auto``: nccl when every rank has its own GPU) and tells the rest."""
    if args["rank"] == 0:
        chosen = str(args["backend"])
        if chosen == "auto":
            gpus = [store.get(f"corral/gpu/{r}") == b"1" for r in range(args["world_size"])]
            chosen = "nccl" if all(gpus) else "gloo"
        store.set("corral/backend", chosen)
        return chosen
    return bytes(store.get("corral/backend")).decode()


def _expected_after(world: int, iterations: int) -> float:
    """Value of every element after the warm-up plus ``iterations`` sums of ``rank + 1``."""
    return world * (world + 1) / 2 * float(world) ** iterations


def _collective(args: Mapping[str, Any], store: Any, torch: Any, dist: Any) -> None:
    rank: int = args["rank"]
    local: int = args["local_rank"]
    world: int = args["world_size"]
    iterations: int = args["iterations"]
    deadline: float = args["deadline"]
    backend = _pick_backend(args, store)
    device = torch.device("cpu")
    if backend == "nccl":
        if not _has_gpu(torch, local):
            raise _Failed("gpu", f"backend nccl needs a GPU for local rank {local}, found none")
        torch.cuda.set_device(local)
        device = torch.device("cuda", local)

    def sync() -> None:
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    left = max(deadline - time.monotonic(), 1.0)
    try:
        dist.init_process_group(
            backend, store=store, rank=rank, world_size=world, timeout=timedelta(seconds=left)
        )
    except Exception as exc:
        raise _Failed("init", f"init_process_group({backend}) failed: {_short(exc)}") from exc
    try:
        numel = max(1, int(args["size_bytes"]) // 4)
        buf = torch.full((numel,), float(rank + 1), dtype=torch.float32, device=device)
        try:
            dist.all_reduce(buf)
            sync()
        except Exception as exc:
            raise _Failed("allreduce", f"warm-up all_reduce failed: {_short(exc)}") from exc
        want = world * (world + 1) / 2
        if not bool(torch.all(buf == want)):
            got = float(buf[0]) if bool(buf[0] != want) else float(buf[buf != want][0])
            raise _Failed("result", f"all_reduce returned {got:g} instead of {want:g}")
        try:
            start = time.perf_counter()
            for _ in range(iterations):
                dist.all_reduce(buf)
            sync()
            seconds = time.perf_counter() - start
        except Exception as exc:
            raise _Failed("allreduce", f"all_reduce failed: {_short(exc)}") from exc
        expected = _expected_after(world, iterations)
        if expected < 1e30:
            worst = float((buf.double() - expected).abs().max()) / expected
            if worst > 1e-5:
                raise _Failed("result", f"all_reduce results off by {worst:.2g} (relative)")
        if rank == 0:
            per_op = seconds / max(iterations, 1)
            size = numel * 4
            algbw = size / per_op / 1e9 if per_op > 0 else 0.0
            _emit(
                {
                    "event": "result",
                    "backend": backend,
                    "world_size": world,
                    "size_bytes": size,
                    "iterations": iterations,
                    "seconds": seconds,
                    "latency_ms": per_op * 1e3,
                    "algbw_gbps": algbw,
                    "busbw_gbps": algbw * 2 * (world - 1) / world,
                }
            )
    finally:
        with contextlib.suppress(Exception):
            dist.destroy_process_group()


def _finish(args: Mapping[str, Any], store: Any) -> None:
    """Rank 0 serves the store: it stays until every rank is done with it."""
    with contextlib.suppress(Exception):
        store.add("corral/done", 1)
    if args["rank"] != 0:
        return
    until = args["deadline"] + JOIN_SLACK
    with contextlib.suppress(Exception):
        while int(store.add("corral/done", 0)) < args["world_size"]:
            if time.monotonic() >= until:
                return
            time.sleep(_POLL)


def worker_main(args: Mapping[str, Any]) -> int:
    """One rank of the smoke test; returns its exit code."""
    rank: int = args["rank"]
    _die_with_parent(int(args["parent"]))
    _exit_when_stdin_closes()
    try:
        began = time.monotonic()
        try:
            import torch
            import torch.distributed as dist
        except ImportError as exc:
            raise _Failed("torch", f"torch cannot be imported by {sys.executable}: {exc}") from exc
        args = dict(args, import_s=round(time.monotonic() - began, 3))
        gpu = args["backend"] != "gloo" and _has_gpu(torch, int(args["local_rank"]))
        store = _open_store(args, dist)
        _join(args, store, gpu)
        _collective(args, store, torch, dist)
        _finish(args, store)
    except _Failed as exc:
        _emit({"event": "error", "rank": rank, "kind": exc.kind, "message": exc.message})
        return EXIT_FAILED
    except Exception as exc:
        _emit({"event": "error", "rank": rank, "kind": "crash", "message": _short(exc)})
        return EXIT_FAILED
    return 0


def _code(returncode: int) -> int:
    return 128 - returncode if returncode < 0 else returncode


def _machine() -> dict[str, Any]:
    """Which machine this is (hosts with one kernel share its CPUs) and its CPUs."""
    found: dict[str, Any] = {}
    with (
        contextlib.suppress(OSError),
        open("/proc/sys/kernel/random/boot_id", encoding="ascii") as fh,
    ):
        found["machine"] = fh.read().strip()
    try:
        found["cpus"] = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        found["cpus"] = os.cpu_count()
    return found


def runner_main(args: Mapping[str, Any], *, watch_stdin: bool) -> int:
    """Start one worker per rank of this host, supervise them, return the worst code."""
    started = time.monotonic()
    deadline = started + float(args["deadline"])
    stop = threading.Event()
    reason: list[str] = []

    def stop_for(why: str) -> None:
        if not reason:
            reason.append(why)
        stop.set()

    for signum in (signal.SIGTERM, signal.SIGHUP, signal.SIGINT):
        signal.signal(signum, lambda s, _f: stop_for(signal.Signals(s).name))
    if watch_stdin:

        def watch() -> None:
            with contextlib.suppress(OSError, ValueError):
                while sys.stdin.buffer.read(4096):
                    pass
            stop_for("stdin closed")

        threading.Thread(target=watch, name="stdin-watch", daemon=True).start()

    ranks: list[int] = [int(r) for r in args["ranks"]]
    _emit(
        {"event": "runner", "host": args["host"], "pid": os.getpid(), "ranks": ranks, **_machine()}
    )
    common = {
        k: args[k]
        for k in ("master_addr", "port", "host", "world_size", "backend", "size_bytes")
        if k in args
    }
    common["iterations"] = int(args.get("iterations", 5))
    common["deadline"] = deadline
    common["parent"] = os.getpid()
    workers: list[tuple[int, subprocess.Popen[bytes]]] = []
    try:
        for local, rank in enumerate(ranks):
            wargs = dict(common, rank=rank, local_rank=local)
            if rank == 0:
                wargs["rank_hosts"] = args.get("rank_hosts", [])
            argv = [sys.executable, "-m", MODULE, "--worker", json.dumps(wargs)]
            workers.append((rank, subprocess.Popen(argv, stdin=subprocess.PIPE)))
        while not all(p.poll() is not None for _, p in workers):
            if time.monotonic() >= deadline + RUNNER_GRACE:
                stop_for("deadline")
            if stop.wait(_POLL):
                break
    except OSError as exc:
        _emit({"event": "error", "rank": None, "kind": "spawn", "message": _short(exc)})
        stop_for("spawn failed")
    finally:
        _kill_workers(workers)
    if reason:
        _emit({"event": "killed", "reason": reason[0]})
    codes = []
    for rank, proc in workers:
        code = _code(proc.returncode)
        codes.append(code)
        if code:
            _emit({"event": "worker_exit", "rank": rank, "code": code})
    if reason and not codes:
        return EXIT_FAILED
    if reason == ["deadline"]:
        return EXIT_DEADLINE
    return max(codes, default=0)


def _kill_workers(workers: Sequence[tuple[int, subprocess.Popen[bytes]]]) -> None:
    live = [p for _, p in workers if p.poll() is None]
    for proc in live:
        with contextlib.suppress(OSError):
            proc.terminate()
    end = time.monotonic() + KILL_GRACE
    for proc in live:
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(max(0.0, end - time.monotonic()))
    for proc in live:
        if proc.poll() is None:
            with contextlib.suppress(OSError):
                proc.kill()
            proc.wait()
    for _, proc in workers:
        if proc.stdin is not None:
            with contextlib.suppress(OSError):
                proc.stdin.close()


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m corral.checks.smoke [JSON]`` (runner) or ``--worker JSON``."""
    argv = list(sys.argv[1:] if argv is None else argv)
    worker = argv[:1] == ["--worker"]
    if len(argv) != 2 if worker else len(argv) > 1:
        print("usage: python -m corral.checks.smoke [JSON]  (or JSON on stdin)", file=sys.stderr)
        return 2
    try:
        if worker:
            return worker_main(json.loads(argv[1]))
        if argv:
            return runner_main(json.loads(argv[0]), watch_stdin=False)
        line = sys.stdin.buffer.readline()
        if not line.strip():
            print("no arguments: expected one JSON line on stdin", file=sys.stderr)
            return 2
        return runner_main(json.loads(line), watch_stdin=True)
    except (ValueError, KeyError, TypeError) as exc:
        print(f"bad smoke-test arguments: {exc!r}", file=sys.stderr)
        return 2


# =========================================================================== coordinator side


def runner_argv(python: str | None) -> list[str]:
    """The command that starts the runner with the first interpreter found on a host."""
    return ["sh", "-c", _SHELL, "sh", *candidates(python)]


@dataclass
class _HostRun:
    """What the coordinator learned about one host's runner."""

    host: Host
    ranks: list[int]
    env: dict[str, str]
    python: str | None
    proc: NodeProcess | None = None
    start_error: str | None = None
    joined: set[int] = field(default_factory=set)
    errors: list[tuple[int | None, str, str]] = field(default_factory=list)
    missing: list[int] = field(default_factory=list)  # ranks rank 0 named
    exit_code: int | None = None
    stopped: bool = False  # we told it to stop before it exited
    killed: str | None = None  # why the runner killed its workers (e.g. "deadline")
    worker_exits: dict[int, int] = field(default_factory=dict)
    facts: RunnerFacts | None = None  # the runner's machine and CPUs
    import_s: list[float] = field(default_factory=list)  # each joined rank's torch import
    stderr: collections.deque[str] = field(
        default_factory=lambda: collections.deque(maxlen=_TAIL_LINES)
    )

    @property
    def all_joined(self) -> bool:
        return set(self.ranks) <= self.joined

    @property
    def blamed(self) -> list[tuple[int | None, str, str]]:
        return [e for e in self.errors if e[1] != WAITING]


@dataclass
class _Smoke:
    """Shared state of one smoke test on the coordinator."""

    transport: Transport
    runs: list[_HostRun]
    args: dict[str, Any]
    join_deadline: float  # the hosts' own (the largest window there can be)
    deadline: float
    began: float = 0.0
    base: float = 0.0  # the window asked for
    window: float = 0.0  # the window sized for the machines: late ranks are stopped after it
    abort: asyncio.Event = field(default_factory=asyncio.Event)
    stopping: bool = False
    timed_out: bool = False
    first_failure: str | None = None
    result: dict[str, Any] | None = None

    def resize(self) -> None:
        """The join window for what the runners said about their machines."""
        facts = {
            r.host.name: r.facts
            or RunnerFacts(len(r.ranks), None, len(r.ranks))  # not yet: one wave
            for r in self.runs
        }
        self.window = join_window(self.base, facts)

    @property
    def all_joined(self) -> bool:
        return all(r.all_joined for r in self.runs)

    def fail(self, host: str) -> None:
        if self.first_failure is None:
            self.first_failure = host
        self.abort.set()


def _ranked(
    hosts: Sequence[Host], master: Host, nproc: Mapping[str, int]
) -> list[tuple[Host, list[int]]]:
    names = [h.name for h in hosts]
    if len(set(names)) != len(names):
        raise ValueError(f"duplicate hosts: {names}")
    if master.name not in names:
        raise ValueError(f"the master {master.name} is not one of the hosts")
    ordered = [h for h in hosts if h.name == master.name] + [
        h for h in hosts if h.name != master.name
    ]
    out: list[tuple[Host, list[int]]] = []
    nxt = 0
    for host in ordered:
        count = int(nproc.get(host.name, host.slots))
        if count < 1:
            raise ValueError(f"{host.name}: nproc must be >= 1, got {count}")
        out.append((host, list(range(nxt, nxt + count))))
        nxt += count
    return out


def _host_env(host: Host, extra: Mapping[str, str] | None) -> dict[str, str]:
    env = dict(host.env)
    if host.interface:
        env.setdefault("NCCL_SOCKET_IFNAME", host.interface)
        env.setdefault("GLOO_SOCKET_IFNAME", host.interface)
    env.update(extra or {})
    return env


def _on_event(smoke: _Smoke, run: _HostRun, event: Mapping[str, Any]) -> None:
    kind = event.get("event")
    if kind == "runner":
        cpus = event.get("cpus")
        machine = event.get("machine")
        run.facts = RunnerFacts(
            len(run.ranks),
            str(machine) if machine else None,
            int(cpus) if isinstance(cpus, int) else None,
        )
        smoke.resize()
    elif kind == "joined":
        run.joined.add(int(event.get("rank", -1)))
        if isinstance(event.get("import_s"), (int, float)):
            run.import_s.append(float(event["import_s"]))
    elif kind == "result":
        smoke.result = dict(event)
    elif kind == "error":
        rank = event.get("rank")
        err_kind = str(event.get("kind", "error"))
        run.errors.append((rank, err_kind, str(event.get("message", ""))))
        if err_kind != WAITING:
            smoke.fail(run.host.name)
    elif kind == "killed":
        run.killed = str(event.get("reason", ""))
    elif kind == "worker_exit":
        run.worker_exits[int(event.get("rank", -1))] = int(event.get("code", 0))
    elif kind == "never_joined":
        by_rank = {r: other for other in smoke.runs for r in other.ranks}
        for r in event.get("ranks", []):
            if r in by_rank:
                by_rank[r].missing.append(int(r))
        missing = [other.host.name for other in smoke.runs if other.missing]
        smoke.fail(missing[0] if missing else run.host.name)


async def _read_events(smoke: _Smoke, run: _HostRun, proc: NodeProcess) -> None:
    while True:
        try:
            line = await proc.stdout.readline()
        except ValueError:  # an over-long line: not ours
            continue
        if not line:
            return
        try:
            event = json.loads(line)
        except ValueError:
            run.stderr.append(line.decode(errors="replace").rstrip())
            continue
        if isinstance(event, dict):
            _on_event(smoke, run, event)


async def _read_stderr(run: _HostRun, proc: NodeProcess) -> None:
    while True:
        try:
            line = await proc.stderr.readline()
        except ValueError:
            continue
        if not line:
            return
        text = line.decode(errors="replace").rstrip()
        if text:
            run.stderr.append(text)


async def _run_host(smoke: _Smoke, run: _HostRun) -> None:
    left = smoke.began + smoke.window - time.monotonic()
    try:
        proc = await asyncio.wait_for(
            smoke.transport.start(run.host, runner_argv(run.python), env=run.env),
            timeout=max(left, 0.1),
        )
    except TransportError as exc:
        run.start_error = exc.message + (f" ({exc.cause})" if exc.cause else "")
        smoke.fail(run.host.name)
        return
    except (CorralError, OSError) as exc:
        run.start_error = str(exc)
        smoke.fail(run.host.name)
        return
    except asyncio.TimeoutError:
        run.start_error = "could not start the smoke test before the deadline"
        smoke.fail(run.host.name)
        return
    run.proc = proc
    args = dict(smoke.args, host=run.host.name, ranks=run.ranks)
    if 0 not in run.ranks:
        args.pop("rank_hosts", None)
    args["deadline"] = max(smoke.join_deadline - time.monotonic(), 0.1)
    proc.write((json.dumps(args) + "\n").encode())
    if smoke.stopping:  # the others were stopped while this one was starting
        _stop(run)
    readers = asyncio.gather(_read_events(smoke, run, proc), _read_stderr(run, proc))
    try:
        await readers
        run.exit_code = await proc.wait()
    except asyncio.CancelledError:
        readers.cancel()
        raise
    if run.exit_code != 0 and not run.stopped and not run.errors and not run.missing:
        smoke.fail(run.host.name)  # died without saying why: no corral, no python, lost


def _stop(run: _HostRun, signum: int = signal.SIGTERM) -> None:
    if run.proc is None or run.exit_code is not None:
        return
    run.stopped = True
    run.proc.close_stdin()
    run.proc.signal(signum)


async def _stop_all(smoke: _Smoke, tasks: Sequence[asyncio.Task[None]]) -> None:
    """Close and signal every runner still there; SIGKILL what is left after a grace."""
    smoke.stopping = True
    for run in smoke.runs:
        _stop(run)
    _, pending = await asyncio.wait(tasks, timeout=KILL_GRACE + 1.0)
    if pending:
        for run in smoke.runs:
            _stop(run, signal.SIGKILL)
        _, pending = await asyncio.wait(pending, timeout=5.0)
    for task in pending:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)


def _tail(run: _HostRun) -> str:
    lines = [line for line in run.stderr if line.strip()]
    for line in reversed(lines):  # the most telling line: an error, else the last one
        if "Error" in line or "error" in line or "No module named" in line:
            return line.strip()
    return lines[-1].strip() if lines else ""


def _late(smoke: _Smoke) -> None:
    """The sized join window is over: the ranks that did not join are missing."""
    for run in smoke.runs:
        if run.start_error is None and not run.missing and not run.all_joined:
            run.missing = [r for r in run.ranks if r not in run.joined]


def _verdict(smoke: _Smoke, run: _HostRun, seconds: float) -> HostCheck:
    n = len(run.ranks)
    joined = f"joined, {n} rank{'s' if n != 1 else ''}"
    if run.start_error is not None:
        return HostCheck(Status.FAIL, f"never joined: {run.start_error}")
    blamed = run.blamed
    if blamed:
        seen = list(dict.fromkeys(f"rank {r}: {m}" if r is not None else m for r, _, m in blamed))
        text = "; ".join(seen[:2]) + (f" (+{len(seen) - 2} more)" if len(seen) > 2 else "")
        return HostCheck(Status.FAIL, text if run.all_joined else f"never joined: {text}")
    if run.missing:
        ranks = ", ".join(str(r) for r in sorted(set(run.missing)))
        why = f"rank{'s' if len(set(run.missing)) > 1 else ''} {ranks} did not join within "
        why += f"{seconds:g} s"
        tail = _tail(run)
        return HostCheck(Status.FAIL, f"never joined: {why}" + (f" ({tail})" if tail else ""))
    if run.killed == "deadline" and not run.stopped:
        if smoke.result is not None:
            return HostCheck(Status.FAIL, f"its ranks did not exit within {seconds:g} s")
        if run.all_joined:
            return HostCheck(
                Status.FAIL, f"joined, but the all-reduce did not finish within {seconds:g} s"
            )
        return HostCheck(Status.FAIL, f"never joined within {seconds:g} s")
    if run.exit_code not in (None, 0) and not run.stopped and not run.errors:
        tail = _tail(run) or _exits(run) or f"the runner exited with code {run.exit_code}"
        if "No module named" in tail:
            tail = f"corral cannot be imported there ({tail}); install it or pass --python"
        return HostCheck(Status.FAIL, tail if run.all_joined else f"never joined: {tail}")
    if run.all_joined:
        return HostCheck(Status.PASS, joined)
    if smoke.timed_out:
        return HostCheck(Status.FAIL, f"never joined within {seconds:g} s")
    if run.proc is None:
        return HostCheck(Status.SKIP, "not started: the test stopped first")
    other = smoke.first_failure or "another host"
    return HostCheck(Status.SKIP, f"not tested: stopped when {other} failed")


def _exits(run: _HostRun) -> str:
    parts = []
    for rank, code in sorted(run.worker_exits.items()):
        sig = f" (signal {code - 128})" if code > 128 else ""
        parts.append(f"rank {rank} exited with code {code}{sig}")
    return "; ".join(parts)


def _fmt_size(size: int) -> str:
    mib = size / (1 << 20)
    if mib >= 1:
        return f"{mib:g} MiB" if mib == int(mib) else f"{mib:.1f} MiB"
    return f"{size / 1024:.0f} KiB"


def _fix(smoke: _Smoke, verdicts: Mapping[str, HostCheck]) -> tuple[str | None, str]:
    """A command to run next, and a hint for the error line."""
    kinds = {k for run in smoke.runs for _, k, _ in run.blamed}
    starts = [r.host.name for r in smoke.runs if r.start_error is not None]
    master = smoke.args["master_addr"]
    port = smoke.args["port"]
    if "store" in kinds:
        return f"ss -ltnp 'sport = :{port}'", ""
    if starts:
        return "corral ping", "check that the host is up and reachable over SSH"
    if kinds & {"torch"} or any(
        "No module named" in v.detail or "interpreter" in v.detail for v in verdicts.values()
    ):
        return (
            "corral exec -- python3 -c 'import corral, torch'",
            "install corral and torch there, or pass --python",
        )
    if kinds & {"connect", "init", "allreduce"} or any(r.missing for r in smoke.runs):
        return (
            "corral exec -- ip -br addr",
            f"check that every host reaches {master}:{port} and each other; set "
            "--gloo-interface/--nccl-interface (GLOO_SOCKET_IFNAME/NCCL_SOCKET_IFNAME) to "
            "the interface the hosts share",
        )
    return None, ""


def _report(smoke: _Smoke, seconds: float, backend: str, size_bytes: int) -> CheckResult:
    verdicts = {run.host.name: _verdict(smoke, run, seconds) for run in smoke.runs}
    ok = smoke.result is not None and all(v.status is Status.PASS for v in verdicts.values())
    if not ok and not any(v.status is Status.FAIL for v in verdicts.values()):
        # nobody to blame, yet no result: the collective itself hung or died
        why = (
            f"joined, but the all-reduce did not finish within {seconds:g} s"
            if smoke.timed_out
            else "joined, but no all-reduce result came back"
        )
        verdicts = {
            name: HostCheck(Status.FAIL, why)
            if v.status is Status.PASS
            else HostCheck(Status.FAIL, f"never joined within {seconds:g} s")
            for name, v in verdicts.items()
        }
    world = sum(len(run.ranks) for run in smoke.runs)
    never = [n for n, v in verdicts.items() if v.detail.startswith("never joined")]
    joined = [run.host.name for run in smoke.runs if run.all_joined]
    late = [run.host.name for run in smoke.runs if not run.all_joined]
    imports = [t for run in smoke.runs for t in run.import_s]
    timed_late = bool(late) and (smoke.timed_out or any(run.missing for run in smoke.runs))
    res = smoke.result or {}
    data: dict[str, Any] = {
        "backend": res.get("backend", backend),
        "world_size": world,
        "bus_bandwidth_gbps": res.get("busbw_gbps"),
        "algbw_gbps": res.get("algbw_gbps"),
        "latency_ms": res.get("latency_ms"),
        "size_bytes": int(res.get("size_bytes", size_bytes)),
        "iterations": res.get("iterations", smoke.args["iterations"]),
        "never_joined": never,
        "ranks": {run.host.name: run.ranks for run in smoke.runs},
        "join_window_s": round(seconds, 1),
        "joined_hosts": joined,
        "import_s": {run.host.name: max(run.import_s) for run in smoke.runs if run.import_s},
    }
    if ok:
        summary = (
            f"all-reduce {_fmt_size(data['size_bytes'])} x {world} ranks ({data['backend']}): "
            f"{data['bus_bandwidth_gbps']:.3g} GB/s bus bandwidth, "
            f"{data['latency_ms']:.3g} ms"
        )
        return CheckResult.from_hosts(CHECK_NAME, verdicts, summary=summary, data=data)
    fix, hint = _fix(smoke, verdicts)
    failing = [(n, v.detail) for n, v in verdicts.items() if v.status is Status.FAIL]
    error = "; ".join(f"{n}: {d}" for n, d in failing)
    if timed_late and len(late) > SHOWN_LATE:
        error = late_summary(joined, late, seconds, imports)
    elif timed_late:
        error += f"; {late_summary(joined, late, seconds, imports, named=False)}"
    if hint:
        error += f" ({hint})"
    if timed_late:
        summary = late_summary(joined, late, seconds, ())
    elif never:
        summary = f"{', '.join(never)} never joined the all-reduce"
    else:
        summary = f"all-reduce across {world} ranks failed on {', '.join(n for n, _ in failing)}"
    return CheckResult.from_hosts(
        CHECK_NAME, verdicts, summary=summary, error=error, fix_command=fix, data=data
    )


def skipped_without_torch(ctx: CheckContext) -> CheckResult | None:
    """The smoke test's result when it cannot run: a launcher that needs no torch
    (:data:`TORCHLESS_LAUNCHERS`) on hosts without torch, which the test needs. A
    warning naming those hosts (the launch is not blocked); None when it can run."""
    launcher = ctx.options.launcher
    if launcher not in TORCHLESS_LAUNCHERS:
        return None
    without = [
        f.host.name for f in ctx.answered() if not (f.facts.get("software") or {}).get("torch")
    ]
    if not without:
        return None
    named = ", ".join(without)
    why = (
        f"skipped: the collective smoke test runs torch.distributed and torch is not "
        f"installed on {named}; --launcher {launcher} does not need torch (each rank checks "
        f"its own {launcher.upper()} group before the script runs)"
    )
    hosts = {
        h.name: HostCheck(Status.WARN, "torch not installed: smoke test skipped")
        if h.name in without
        else HostCheck(Status.SKIP, f"smoke test skipped (no torch on {named})")
        for h in ctx.cluster.hosts
    }
    return CheckResult.from_hosts(
        CHECK_NAME,
        hosts,
        summary=f"skipped: no torch on {named} (--launcher {launcher} needs none)",
        warning=why,
        data={"skipped": "no torch", "hosts_without_torch": without},
    )


async def smoke_test(
    transport: Transport,
    hosts: Sequence[Host],
    *,
    master: Host,
    master_addr: str,
    port: int,
    nproc: Mapping[str, int],
    backend: str = "auto",
    python: Mapping[str, str | None] | None = None,
    env: Mapping[str, Mapping[str, str]] | None = None,
    deadline: float = 30.0,
    size_mb: float = 4.0,
    iterations: int = 5,
) -> CheckResult:
    """Run one all-reduce smoke test across ``hosts``; check ``collective``.

    The master runs rank 0 (it is moved first); the other hosts follow in order,
    ``nproc[name]`` ranks each (default: the host's slots). ``port`` must be free
    on the master. ``python`` gives the interpreter per host name (default: this
    interpreter's path where it exists there, else ``python3``); ``env`` adds
    variables per host name (e.g. ``GLOO_SOCKET_IFNAME``) to the host's own env
    and interface. ``deadline`` is the join window's base: it grows with the ranks
    per CPU of the busiest machine (:func:`corral.checks.joinwindow.join_window`,
    sized from what each runner says about its machine); late ranks are stopped
    about 5 s after the window. Every runner is gone when this returns, pass or
    fail, at the latest about the window + 5 s (plus kill grace), or, once every
    rank joined, the hosts' cap (:func:`~corral.checks.joinwindow.host_cap`) + 5 s. Bad
    arguments (unknown backend, port 0, master not among ``hosts``) raise ValueError.
    """
    if backend not in ("auto", "gloo", "nccl"):
        raise ValueError(f"backend must be auto, gloo or nccl, got {backend!r}")
    if not 0 < port < 65536:
        raise ValueError(f"port must be a concrete TCP port (1-65535), got {port}")
    if deadline <= 0 or size_mb <= 0 or iterations < 1:
        raise ValueError("deadline and size_mb must be positive and iterations >= 1")
    began = time.monotonic()
    ranked = _ranked(hosts, master, nproc)
    size_bytes = max(4, int(size_mb * (1 << 20)) // 4 * 4)
    rank_hosts = [host.name for host, ranks in ranked for _ in ranks]
    runs = [
        _HostRun(
            host=host,
            ranks=ranks,
            env=_host_env(host, (env or {}).get(host.name)),
            python=(python or {}).get(host.name) or host.python,
        )
        for host, ranks in ranked
    ]
    smoke = _Smoke(
        transport=transport,
        runs=runs,
        args={
            "master_addr": master_addr,
            "port": int(port),
            "world_size": len(rank_hosts),
            "backend": backend,
            "size_bytes": size_bytes,
            "iterations": int(iterations),
            "rank_hosts": rank_hosts,
        },
        join_deadline=began + host_cap(deadline, len(rank_hosts)),
        deadline=began + host_cap(deadline, len(rank_hosts)) + MARGIN,
        began=began,
        base=deadline,
    )
    smoke.resize()
    tasks = [asyncio.ensure_future(_run_host(smoke, run)) for run in runs]
    aborted = asyncio.ensure_future(smoke.abort.wait())
    try:
        while not all(t.done() for t in tasks):
            now = time.monotonic()
            left = smoke.deadline - now
            if not smoke.all_joined:  # the late are stopped once the sized window is over
                left = min(left, smoke.began + smoke.window + MARGIN - now)
            if left <= 0:
                smoke.timed_out = True
                if not smoke.all_joined:
                    _late(smoke)
                break
            await asyncio.wait([*tasks, aborted], timeout=left, return_when=asyncio.FIRST_COMPLETED)
            if aborted.done():
                break
    finally:
        aborted.cancel()
        if not all(t.done() for t in tasks):
            await asyncio.shield(_stop_all(smoke, tasks))
    for task in tasks:  # a bug here must not pass for a host problem
        if not task.cancelled() and task.exception() is not None:
            raise task.exception()  # type: ignore[misc]
    result = _report(smoke, smoke.window, backend, size_bytes)
    result.duration_s = time.monotonic() - began
    return result


if __name__ == "__main__":
    code = main()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)  # skip torch's C++ static destructors (they can abort a finished rank)
