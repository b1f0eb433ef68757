"""The queue of ``corral serve`` at 10,000 queued jobs: request latency and idle CPU.

A real ``corral serve`` subprocess (``tests/serverlib.py``) on SQLite, one SSH machine
that is never health-checked (``--health-interval 0``), so every queued job waits and
the scheduler's round runs every second against the whole queue:

* **idle CPU, empty queue** (the baseline): the server's own CPU time over
  ``--idle-seconds`` with nothing queued and no request.
* the queue is filled to ``--queued`` jobs: all but ``--enqueues`` of them written
  straight to the store (two users, mixed priorities, the request a real enqueue
  stores), the rest through ``POST /api/jobs/queue``.
* **request latency at 10,000 queued** (one keep-alive client, the kinds shuffled,
  one at a time): ``POST /api/jobs/queue`` (enqueue; its answer carries the job's
  position and reason), ``GET /api/jobs/{id}`` of a queued job (its reason as the
  queue says it), ``GET /api/queue?limit=50`` (the head of the queue),
  ``GET /api/queue?offset=N&limit=50`` (its tail), ``GET /api/me``, an enqueue of a
  user over their queued cap (429), and ``GET /healthz`` (the baseline: the same
  HTTP stack with no store work). p50/p99 of each.
* **server CPU per request** of each kind (a block of ``--cpu-requests`` of one kind:
  the server's CPU time over their count; enqueues before the latency run, at
  ~9,600 queued): what a request costs whatever else runs on the machine.
* **idle CPU at 10,000 queued**: as the baseline, after the requests.

    python benchmarks/bench_queue.py [--queued 10000] [--enqueues 300] [--requests 300]
                                     [--idle-seconds 20]
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
import psutil
from bench_serve import _latency
from benchlib import ROOT, bench_env, exit_on_sigterm, finish, log, metric, ratio

sys.path.insert(0, str(ROOT))
from tests.serverlib import LiveServer, live_server

NAME = "queue"
LATENCY_TARGET_MS = 50.0
IDLE_TARGET_PERCENT = 2.0
REQUEST = {"script": "train.py", "launcher": "python", "preflight": False}
USERS = ("alice", "bob")


def _cpu(server: LiveServer) -> float:
    """The server process's CPU seconds so far (user + system)."""
    assert server.proc is not None
    times = psutil.Process(server.proc.pid).cpu_times()
    return float(times.user + times.system)


def idle_percent(server: LiveServer, seconds: float) -> float:
    """The server's CPU use, % of one core, over ``seconds`` without a request."""
    time.sleep(2.0)  # let the last request's work (and a scheduler round) finish
    before, started = _cpu(server), time.monotonic()
    time.sleep(seconds)
    return 100.0 * (_cpu(server) - before) / (time.monotonic() - started)


def fill(db_url: str, count: int, seed: int = 11) -> list[str]:
    """``count`` queued jobs written straight to the server's store, as an enqueue
    writes them (the request stored, owners and priorities mixed); their ids."""
    from corral.job.ids import new_job_id
    from corral.service.models import JobRequest
    from corral.service.planner import stored_request
    from corral.store import open_store
    from corral.store.models import Job

    rng = random.Random(seed)
    stored = stored_request(JobRequest.model_validate(REQUEST))
    ids: list[str] = []
    now = time.time() - count
    with open_store(db_url) as store, store.session() as s:
        for i in range(count):
            job_id = f"{new_job_id()}-{i:05d}"  # its ids are unique per second
            ids.append(job_id)
            s.add(
                Job(
                    id=job_id,
                    kind="distributed",
                    state="queued",
                    reason="",
                    request=stored,
                    plan={},
                    machine_ids=[],
                    created=now + i,
                    queued=now + i,
                    run_dir="",
                    owner=USERS[i % len(USERS)],
                    priority=rng.choice((0, 0, 0, 0, 1, -1)),
                )
            )
    return ids


def measure(server: LiveServer, args: argparse.Namespace) -> dict[str, Any]:
    """Everything but the baseline's idle CPU."""
    tokens: dict[str, str] = {}
    with server.client() as admin:
        for name in (*USERS, "carol"):
            r = admin.post("/api/users", json={"name": name, "role": "user"})
            r.raise_for_status()
            tokens[name] = r.json()["token"]
        admin.put("/api/users/carol/limits", json={"queued": 0}).raise_for_status()
        m = admin.post("/api/network/machines", json={"name": "gpu1", "host": "10.9.9.9"})
        m.raise_for_status()
    idle_empty = idle_percent(server, args.idle_seconds)
    log(f"idle, empty queue: {idle_empty:.2f}% of a core")
    started = time.monotonic()
    filled = fill(server.db_url, args.queued - args.enqueues - args.cpu_requests)
    log(f"{len(filled):,} queued jobs written in {time.monotonic() - started:.1f} s")
    with httpx.Client(base_url=server.url, timeout=60.0) as client:
        time.sleep(1.0)
        before = _cpu(server)
        for i in range(args.cpu_requests):
            token = tokens[USERS[i % len(USERS)]]
            r = client.post(
                "/api/jobs/queue", json=REQUEST, headers={"Authorization": f"Bearer {token}"}
            )
            r.raise_for_status()
        enqueue_cpu = 1000.0 * (_cpu(server) - before) / args.cpu_requests

    kinds = ["enqueue"] * args.enqueues + [
        k
        for k in ("status", "head", "tail", "me", "over_cap", "healthz")
        for _ in range(args.requests)
    ]
    random.Random(5).shuffle(kinds)
    samples: dict[str, list[float]] = {k: [] for k in set(kinds)}
    errors: list[str] = []
    rng = random.Random(9)
    expected = {"enqueue": 201, "over_cap": 429}
    with httpx.Client(base_url=server.url, timeout=60.0) as client:
        for i, kind in enumerate(kinds):
            user = USERS[i % len(USERS)]
            call, headers = _call(kind, tokens[user], tokens, filled, rng, args.queued)
            method, path, extra = call
            t0 = time.perf_counter()
            r = client.request(method, path, headers=headers, **extra)
            samples[kind].append(time.perf_counter() - t0)
            if r.status_code != expected.get(kind, 200):
                errors.append(f"{kind} {method} {path}: {r.status_code} {r.text[:200]}")
        cpu_ms = cpu_per_request(server, client, tokens, filled, args)
        cpu_ms["enqueue"] = enqueue_cpu
    with server.client() as admin:
        queued = len(admin.get("/api/queue").json())
        tail = admin.get("/api/queue", params={"limit": 1, "offset": queued - 1}).json()
    idle_full = idle_percent(server, args.idle_seconds)
    log(f"idle, {queued:,} queued: {idle_full:.2f}% of a core")
    return {
        "queued": queued,
        "tail_reason": tail[0]["reason"] if tail else None,
        "latency": {kind: _latency(values) for kind, values in samples.items()},
        "server_cpu_ms_per_request": cpu_ms,
        "idle_percent_empty": idle_empty,
        "idle_percent_full": idle_full,
        "errors": errors[:20],
        "error_count": len(errors),
    }


def _call(
    kind: str,
    token: str,
    tokens: dict[str, str],
    filled: list[str],
    rng: random.Random,
    queued: int,
) -> tuple[tuple[str, str, dict[str, Any]], dict[str, str]]:
    """The request of one ``kind``: (method, path, httpx keywords) and its headers."""
    headers = {"Authorization": f"Bearer {token}"}
    if kind == "enqueue":
        return ("POST", "/api/jobs/queue", {"json": REQUEST}), headers
    if kind == "over_cap":
        carol = {"Authorization": f"Bearer {tokens['carol']}"}
        return ("POST", "/api/jobs/queue", {"json": REQUEST}), carol
    if kind == "status":
        return ("GET", f"/api/jobs/{rng.choice(filled)}", {}), headers
    if kind == "head":
        return ("GET", "/api/queue", {"params": {"limit": 50}}), headers
    if kind == "tail":
        return ("GET", "/api/queue", {"params": {"limit": 50, "offset": queued - 50}}), headers
    if kind == "me":
        return ("GET", "/api/me", {}), headers
    return ("GET", "/healthz", {}), {}


def cpu_per_request(
    server: LiveServer,
    client: httpx.Client,
    tokens: dict[str, str],
    filled: list[str],
    args: argparse.Namespace,
) -> dict[str, float]:
    """The server's CPU milliseconds per request of each kind (a block of
    ``--cpu-requests`` of one kind, its CPU time over their count): what a request
    costs, whatever else runs on the machine. Enqueues are not repeated (the queue
    stays at its size)."""
    rng = random.Random(3)
    out: dict[str, float] = {}
    for kind in ("status", "head", "tail", "me", "over_cap", "healthz"):
        time.sleep(1.0)
        before = _cpu(server)
        for _ in range(args.cpu_requests):
            (method, path, extra), headers = _call(
                kind, tokens[USERS[0]], tokens, filled, rng, args.queued
            )
            client.request(method, path, headers=headers, **extra)
        out[kind] = 1000.0 * (_cpu(server) - before) / args.cpu_requests
    return out


ROUTES = {
    "enqueue": "POST /api/jobs/queue (position + reason in the answer)",
    "status": "GET /api/jobs/{id} of a queued job",
    "head": "GET /api/queue?limit=50",
    "tail": "GET /api/queue?offset=N-50&limit=50",
    "me": "GET /api/me",
    "over_cap": "POST /api/jobs/queue over the user's queued cap (429)",
}


def main(argv: list[str] | None = None) -> int:
    """Measure, write ``results/queue.json``, print a short summary."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--queued", type=int, default=10_000)
    parser.add_argument("--enqueues", type=int, default=300, help="through the API")
    parser.add_argument("--requests", type=int, default=300, help="of each other kind")
    parser.add_argument("--idle-seconds", type=float, default=20.0)
    parser.add_argument("--cpu-requests", type=int, default=100, help="per kind, CPU blocks")
    args = parser.parse_args(argv)
    exit_on_sigterm()
    os.environ.update({k: v for k, v in bench_env().items() if k == "PYTHONPATH"})
    top = Path(tempfile.mkdtemp(prefix="corral-bench-queue-"))
    try:
        serve_args = ["--health-interval", "0", "--max-queued", str(args.queued * 2)]
        with live_server(top / "srv", args=serve_args) as server:
            result = measure(server, args)
    finally:
        shutil.rmtree(top, ignore_errors=True)

    lat = result["latency"]
    base = lat["healthz"]
    metrics = []
    p99s = []
    for kind, route in ROUTES.items():
        for pct in ("p99", "p50"):
            value = lat[kind][f"{pct}_ms"]
            headline = pct == "p99"
            if headline:
                p99s.append(value)
            metrics.append(
                metric(
                    f"{route}, {result['queued']:,} queued: {pct}"
                    + ("" if headline else " (info)"),
                    value,
                    "ms",
                    f"<= {LATENCY_TARGET_MS:g} ms" if headline else "-",
                    (value is not None and value <= LATENCY_TARGET_MS) if headline else None,
                    baseline=base[f"{pct}_ms"],
                    baseline_desc=f"GET /healthz {pct}, same run",
                    ratio_value=ratio(value, base[f"{pct}_ms"]),
                )
            )
    idle_full, idle_empty = result["idle_percent_full"], result["idle_percent_empty"]
    idle_met = idle_full <= IDLE_TARGET_PERCENT
    metrics.append(
        metric(
            f"idle server CPU, {result['queued']:,} queued, {args.idle_seconds:g} s",
            idle_full,
            "% of a core",
            f"<= {IDLE_TARGET_PERCENT:g}%",
            idle_met,
            baseline=idle_empty,
            baseline_desc="the same server with an empty queue, same run",
            ratio_value=ratio(idle_full, idle_empty),
        )
    )
    cpu = result["server_cpu_ms_per_request"]
    for kind in ("enqueue", "status", "head", "tail", "over_cap"):
        metrics.append(
            metric(
                f"server CPU per request, {ROUTES[kind]} (info)",
                cpu[kind],
                "ms",
                "-",
                None,
                baseline=cpu["healthz"],
                baseline_desc="GET /healthz, same run",
                ratio_value=ratio(cpu[kind], cpu["healthz"]),
            )
        )
    latency_met = all(v is not None and v <= LATENCY_TARGET_MS for v in p99s)
    failed = result["error_count"] > 0 or result["queued"] != args.queued
    code = finish(
        NAME,
        {
            "title": "corral serve queue at scale",
            "status": "failed" if failed else "ok",
            "reason": (
                f"{result['error_count']} unexpected answers, {result['queued']} queued"
                if failed
                else ""
            ),
            "config": {
                "queued": args.queued,
                "enqueues_via_api": args.enqueues,
                "requests_per_kind": args.requests,
                "idle_seconds": args.idle_seconds,
                "store": "sqlite",
                "machines": "1 SSH machine, never health-checked (every job waits)",
            },
            "samples": result,
            "metrics": metrics,
            "target": f"every route's p99 <= {LATENCY_TARGET_MS:g} ms; idle <= "
            f"{IDLE_TARGET_PERCENT:g}% of a core",
            "met": latency_met and idle_met and not failed,
        },
    )
    print(
        f"queue: {result['queued']:,} queued; p99 ms "
        + ", ".join(f"{k} {lat[k]['p99_ms'] or 0:.1f}" for k in (*ROUTES, "healthz"))
        + f"; idle CPU {idle_full:.2f}% (empty queue {idle_empty:.2f}%)"
    )
    return code


if __name__ == "__main__":
    sys.exit(main())
