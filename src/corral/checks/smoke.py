"""Pre-flight check "collective": a short all-reduce across every host and rank.

It runs the job's real communication path once, under a hard deadline, before
anything is launched: every rank joins a rendezvous store on the master, the
process group comes up with the job's backend (``gloo``; ``nccl`` where every
rank has a GPU), and a few all-reduces of a ~4 MiB float32 buffer are timed.
It passes with the measured bus bandwidth, or fails naming the host(s) that
never joined and why.

Three modules:

* **Host side**, :mod:`corral.checks.smoke_host` (``python -m
  corral.checks.smoke`` runs it too): one *runner* per host, started by the
  coordinator with its arguments as one JSON line on stdin, starts one *worker*
  per rank; the ranks join a ``TCPStore`` on the master, rank 0 names who never
  joined, then a checked, timed all-reduce; everything is reported as JSON lines.

* **Coordinator side**, here, :func:`smoke_test`: starts every runner through the
  transport in parallel, reads their events and returns a
  :class:`~corral.checks.result.CheckResult` named ``collective``. A host
  whose start fails (unreachable, auth, no interpreter, no corral) counts as
  never joined and stops the test at once; after ``deadline`` plus a small
  margin every runner is closed, signalled and waited for, so nothing stays.

* **Verdict**, :mod:`corral.checks.smoke_report`: what each runner said, the
  join window sized from it, and the result built from them.

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
import json
import os
import signal
import sys
import time
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from corral.checks.joinwindow import RunnerFacts, host_cap
from corral.checks.result import CheckResult, HostCheck, Status
from corral.checks.smoke_host import (
    EXIT_DEADLINE,
    EXIT_FAILED,
    HOST_MODULE,
    JOIN_SLACK,
    KILL_GRACE,
    RUNNER_GRACE,
    WAITING,
    main,
    runner_main,
    worker_main,
)
from corral.checks.smoke_report import (
    CHECK_NAME,
    SHOWN_LATE,
    HostRun,
    SmokeState,
    late,
    report,
)
from corral.errors import CorralError, TransportError
from corral.remote.python import candidates

if TYPE_CHECKING:
    from corral.checks.context import CheckContext
    from corral.cluster.model import Host
    from corral.transport.base import NodeProcess, Transport

__all__ = [
    "CHECK_NAME",
    "EXIT_DEADLINE",
    "EXIT_FAILED",
    "JOIN_SLACK",
    "KILL_GRACE",
    "MARGIN",
    "MODULE",
    "RUNNER_GRACE",
    "SHOWN_LATE",
    "TORCHLESS_LAUNCHERS",
    "WAITING",
    "main",
    "runner_argv",
    "runner_main",
    "skipped_without_torch",
    "smoke_test",
    "worker_main",
]

#: The module the hosts run (light: it imports nothing of corral's).
MODULE = HOST_MODULE
#: Launchers whose jobs do not need torch (the smoke test does).
TORCHLESS_LAUNCHERS = ("mlx",)
#: The coordinator waits this long past the deadline for the runners' reports.
MARGIN = 5.0

# the coordinator's state and verdict under their former names (unit tests use them)
_HostRun = HostRun
_Smoke = SmokeState
_late = late
_report = report

_SHELL = (
    'for p in "$@"; do if command -v "$p" >/dev/null 2>&1; then exec "$p" -m '
    + MODULE
    + '; fi; done; echo "no python interpreter found (tried: $*)" >&2; exit 127'
)


def runner_argv(python: str | None) -> list[str]:
    """The command that starts the runner with the first interpreter found on a host."""
    return ["sh", "-c", _SHELL, "sh", *candidates(python)]


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


def _on_event(smoke: SmokeState, run: HostRun, event: Mapping[str, Any]) -> None:
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


async def _read_events(smoke: SmokeState, run: HostRun, proc: NodeProcess) -> None:
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


async def _read_stderr(run: HostRun, proc: NodeProcess) -> None:
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


async def _run_host(smoke: SmokeState, run: HostRun) -> None:
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


def _stop(run: HostRun, signum: int = signal.SIGTERM) -> None:
    if run.proc is None or run.exit_code is not None:
        return
    run.stopped = True
    run.proc.close_stdin()
    run.proc.signal(signum)


async def _stop_all(smoke: SmokeState, tasks: Sequence[asyncio.Task[None]]) -> None:
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
        HostRun(
            host=host,
            ranks=ranks,
            env=_host_env(host, (env or {}).get(host.name)),
            python=(python or {}).get(host.name) or host.python,
        )
        for host, ranks in ranked
    ]
    smoke = SmokeState(
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
                    late(smoke)
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
    result = report(smoke, smoke.window, backend, size_bytes)
    result.duration_s = time.monotonic() - began
    return result


if __name__ == "__main__":
    code = main()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)  # skip torch's C++ static destructors (they can abort a finished rank)
