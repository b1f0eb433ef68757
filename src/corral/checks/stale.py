"""Check 8, stale processes: processes of an ended corral job still alive on a
host, or anything holding its GPUs or the rendezvous port (a warning with the
PIDs and the command that stops them).

Only the leftovers of a job that is gone are stale: a job whose agent (or actor
worker) still runs on the host is running, and is named as ``busy: job X is
running here`` (a warning, without a kill, when it holds the GPUs or the port).
The job being checked is never counted: the host side skips processes with its
``CORRAL_JOB_ID`` (the agents ``corral run`` starts while the checklist runs) and
the check session's own family. Hosts that are one machine (``local:N``, or two
names for one host) list each process once.

On a shared box, leftovers of another corral installation's jobs (a local node dir
under another run dir than this job's) are named as that installation's, once,
as information: they are not this job's to kill, so no warning and no ``kill``."""

from __future__ import annotations

import os
from pathlib import PurePosixPath
from typing import Any

from corral.checks.context import CheckContext
from corral.checks.result import CheckResult, HostCheck, Status

NAME = "stale"


def _pids(procs: list[dict[str, Any]]) -> str:
    return " ".join(str(p["pid"]) for p in procs)


def _busy_text(busy: list[dict[str, Any]]) -> str:
    return "; ".join(
        f"busy: job {b['job'] or '?'} is running here ({len(b['pids'])} process(es))" for b in busy
    )


def installation_of(proc: dict[str, Any], run_dir: str | None) -> str | None:
    """The run dir of another corral installation whose job ``proc`` is a leftover of
    (a local node's dir is ``RUN_DIR/JOB/nodes/HOST``); None: this job's run dir, or
    not known (no node dir, an SSH node's ``~/.corral/runs/JOB/HOST``)."""
    node_dir = proc.get("node_dir")
    if not run_dir or not node_dir:
        return None
    path = PurePosixPath(str(node_dir))
    if not path.is_absolute() or path.parent.name != "nodes":
        return None
    root = str(path.parent.parent.parent)
    return None if os.path.realpath(root) == os.path.realpath(run_dir) else root


def _elsewhere_text(procs: list[dict[str, Any]], roots: list[str]) -> str:
    ids = sorted({str(p["job"]) for p in procs if p.get("job")})
    return (
        f"{len(procs)} process(es) of another corral installation's job(s) "
        f"{', '.join(ids) or '?'} (run dir {', '.join(roots)}): not this one's, left alone"
    )


def check(ctx: CheckContext) -> CheckResult:
    """Warn per host with what is left over; pass (naming running jobs) when nothing is."""
    hosts: dict[str, HostCheck] = {}
    data: dict[str, Any] = {}
    fixes: list[str] = []
    reported: dict[str, set[int]] = {}  # machine (its processes' scope) -> PIDs named
    first_host: dict[str, str] = {}
    busy_seen: list[str] = []
    elsewhere_seen: list[str] = []
    run_dir = ctx.options.run_dir
    for host in ctx.cluster.hosts:
        f = ctx.facts[host.name]
        if not f.ok:
            hosts[host.name] = HostCheck(Status.SKIP, "host did not answer")
            continue
        machine = str(f.facts.get("process_scope") or host.name)
        first = first_host.setdefault(machine, host.name)
        done = reported.setdefault(machine, set())
        listener = f.facts.get("listener") or {}
        holders = [] if listener.get("free", True) else (listener.get("holders") or [])
        busy = [
            {"job": b.get("job"), "pids": [p for p in b.get("pids") or [] if p not in done]}
            for b in f.facts.get("busy") or []
        ]
        busy = [b for b in busy if b["pids"]]
        running = {p: b["job"] for b in busy for p in b["pids"]}
        jobs = [p for p in f.facts.get("stale") or [] if p["pid"] not in done]
        mine = run_dir if host.local else None  # a remote node's dir says nothing
        elsewhere = [p for p in jobs if installation_of(p, mine) is not None]
        jobs = [p for p in jobs if p not in elsewhere]
        gpu = [p for p in f.facts.get("gpu_processes") or [] if p["pid"] not in done]
        port = [p for p in holders if p["pid"] not in done]
        data[host.name] = {"corral": jobs, "gpu": gpu, "port": port, "busy": busy}
        if elsewhere:
            data[host.name]["elsewhere"] = elsewhere
        named = {p["pid"] for p in [*jobs, *gpu, *port, *elsewhere]} | set(running)
        if not named:
            same = first != host.name and bool(done)
            hosts[host.name] = HostCheck(
                Status.PASS, f"same machine as {first}" if same else "none"
            )
            continue
        done |= named
        parts = []
        if jobs:
            ids = sorted({str(p["job"]) for p in jobs if p.get("job")})
            parts.append(
                f"{len(jobs)} process(es) of ended corral job(s) {', '.join(ids) or '?'}: "
                + _pids(jobs)
            )
        if gpu:
            parts.append("GPU in use by PID " + _holders(gpu, running))
        if port:
            parts.append(f"port {ctx.options.master_port} held by PID " + _holders(port, running))
        if busy:
            parts.append(_busy_text(busy))
            busy_seen.extend(f"job {b['job'] or '?'} is running on {host.name}" for b in busy)
        if elsewhere:
            roots = sorted({str(installation_of(p, mine)) for p in elsewhere})
            parts.append(_elsewhere_text(elsewhere, roots))
            elsewhere_seen.append(f"{host.name}: {_elsewhere_text(elsewhere, roots)}")
        kill = sorted({p["pid"] for p in [*jobs, *gpu, *port] if p["pid"] not in running})
        if kill or gpu or port:
            hosts[host.name] = HostCheck(Status.WARN, "; ".join(parts))
        else:
            hosts[host.name] = HostCheck(Status.PASS, "; ".join(parts))
        if kill:
            argv = ["kill", *(str(p) for p in kill)]
            fixes.append(" ".join(argv) if ctx.is_local else ctx.ssh(host, argv))
    if ctx.is_local and fixes:
        fixes = list(dict.fromkeys(fixes))
    summary = "no leftover processes"
    if busy_seen:
        summary += "; busy: " + ", ".join(busy_seen)
    if elsewhere_seen:
        summary += "; " + "; ".join(elsewhere_seen)
    return CheckResult.from_hosts(
        NAME,
        hosts,
        summary=summary,
        fix_command="; ".join(fixes) or None,
        data=data,
    )


def _holders(procs: list[dict[str, Any]], running: dict[int, str | None]) -> str:
    """``12 34 (job X, running)``: the PIDs, naming a running job's own."""
    return " ".join(
        f"{p['pid']} (job {running[p['pid']] or '?'}, running)"
        if p["pid"] in running
        else str(p["pid"])
        for p in procs
    )
