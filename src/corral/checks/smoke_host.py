"""Host side of the all-reduce smoke test (:mod:`corral.checks.smoke`).

``python -m corral.checks.smoke_host`` (or ``python -m corral.checks.smoke``) on
a host needs corral and torch there, like the job. The coordinator starts one
*runner* per host and sends its arguments as one JSON line on stdin (or, for a
manual run, as the only argv item). The runner starts one *worker* per rank of
the host (this module again, ``--worker JSON``, same interpreter) and kills them
at the deadline, when its stdin closes (the coordinator went away) or on
SIGTERM/SIGHUP; workers also die with the runner (``PR_SET_PDEATHSIG``).

Rank 0 serves a ``TCPStore`` on the master port; every rank sets
``corral/joined/<rank>`` to its host name and waits until all have joined. At
the deadline rank 0 names the ranks without a ``joined`` key and their hosts.
Once all joined: ``init_process_group`` with the remaining time as timeout, a
checked warm-up all-reduce (sum of ``rank + 1``), ``iterations`` timed ones
measured on rank 0, a result check, ``destroy_process_group``. Everything is
reported as one JSON object per line on stdout (``runner``, ``joined``,
``never_joined``, ``result``, ``error``, ``worker_exit``, ``killed``); the
runner exits with the worst worker code.

This module imports nothing of corral's and torch only in the workers, so a
runner starts fast.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from datetime import timedelta
from typing import Any

#: What the hosts run: ``python -m HOST_MODULE`` (runner) and ``--worker`` (rank).
HOST_MODULE = "corral.checks.smoke_host"
#: A runner kills its workers this long after the deadline (rank 0 reports first).
RUNNER_GRACE = 3.0
#: Ranks other than 0 wait this much longer for the others, so rank 0 names who is missing.
JOIN_SLACK = 1.0
#: After SIGTERM, how long before SIGKILL (runner -> workers, coordinator -> runners).
KILL_GRACE = 2.0
#: Exit codes of workers and runners.
EXIT_FAILED = 3
EXIT_DEADLINE = 124
#: Error kinds that do not blame the reporting rank's host (it only waited for others).
WAITING = "waiting"

_MAX_MESSAGE = 1500
_POLL = 0.05


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
            argv = [sys.executable, "-m", HOST_MODULE, "--worker", json.dumps(wargs)]
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
    """``python -m corral.checks.smoke_host [JSON]`` (runner) or ``--worker JSON``."""
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


if __name__ == "__main__":
    code = main()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)  # skip torch's C++ static destructors (they can abort a finished rank)
