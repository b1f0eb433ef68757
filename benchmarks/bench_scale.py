"""Scale of ``corral serve``: a big store, many SSE subscribers, ``serve gc``.

Extends ``bench_serve.py`` (same store contents, same request mix, same SSE job and
checks; its helpers are reused) to the sizes of issue 24 §6:

* **a big store**: 10,000 jobs and 1,000,000 events (``--jobs``/``--events``), filled
  by :func:`fill_store`, a bulk generator: real execution plans from the planner
  for a few job shapes, then every row inserted in large batches (executemany on
  SQLite; ``COPY`` for the events on PostgreSQL), 20 jobs ``running`` under a live
  supervisor (this process) so the ingest loop works every round. The jobs' ends
  are spread over the last 60 days. On SQLite and on a real PostgreSQL
  (``tests/pgserver.py``), ``GET /api/network/distributed/status/{id}`` on random
  jobs, ``GET /api/jobs?limit=50`` and ``GET /healthz`` (the baseline: the same HTTP
  stack with no store work) are sent one at a time in a shuffled order against a
  real ``corral serve``: p50/p99 of each. For the ratio against today's scale the
  same is measured in the same run on a store of ``--reference-jobs`` /
  ``--reference-events`` (bench_serve's 1,000 / 100,000).
* **SSE to many subscribers**: bench_serve's paced-writer job (4 ranks, numbered
  lines) followed by ``--sse-subscribers`` (100) streams; every subscriber must get
  every line exactly once; the slowest subscriber's rate against ``corral run``'s
  stdout of the same script (>= 0.8x).
* **gc**: ``corral serve gc --older-than 30d`` on the big SQLite store (each
  finished job with a small run dir): a dry run, then the real one; what it deleted,
  how long it took, and that no running or queued job lost anything.

    python benchmarks/bench_scale.py [--jobs 10000] [--events 1000000] [--requests 500]
        [--stores sqlite,postgresql] [--reference-jobs 1000] [--reference-events 100000]
        [--sse-subscribers 100] [--sse-rate 20000] [--sse-seconds 5] [--no-sse]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import psutil
from bench_serve import (
    RUNNING_JOBS,
    SSE_RANKS,
    _cpu_of,
    _event_counts,
    _latency,
    _machines,
    _state_of,
    sse_api,
    sse_cli,
)
from benchlib import (
    ROOT,
    bench_env,
    corral_cli,
    exit_on_sigterm,
    finish,
    log,
    metric,
    ratio,
)

sys.path.insert(0, str(ROOT))
from tests.serverlib import live_server

NAME = "scale"
LATENCY_TARGET_MS = 50.0
SSE_TARGET = 0.8
SPAN_DAYS = 60.0
GC_AGE = "30d"
BATCH_JOBS = 2000
BATCH_EVENTS = 50_000
#: (nodes, processes per node) of the job shapes whose real plans the jobs reuse
SHAPES = [(1, 1), (1, 8), (2, 2), (2, 8), (4, 4), (4, 8), (1, 4), (2, 1)]


# -- the bulk generator --------------------------------------------------------------------


def _templates(machines: list[Any], run_dir: Path, rng: random.Random) -> list[dict[str, Any]]:
    """A real request and execution plan (from the planner) for each job shape."""
    from corral.service.models import JobRequest, ResourceRequirements
    from corral.service.planner import Selection, execution_plan, job_description, stored_request
    from corral.service.settings import ServerSettings

    settings = ServerSettings(run_dir=run_dir)
    out = []
    for k, (n_nodes, nproc) in enumerate(SHAPES):
        chosen = rng.sample(machines, n_nodes)
        request = JobRequest(
            name=f"exp-{k}",
            script="examples/train_ddp.py",
            args=["--steps", "1000", "--checkpoint-every", "100"],
            launcher="torchrun",
            nproc_per_node=nproc,
            resource_requirements=ResourceRequirements(num_machines=n_nodes),
            config={"batch_size": 64, "learning_rate": 0.001, "output_dir": "out"},
            adjust_config=True,
            env={"WANDB_MODE": "offline"},
            max_restarts=1,
            checkpoint_dir="/srv/ckpt",
        )
        launch = job_description(f"template-{k}", request, chosen, settings)
        selection = Selection(chosen=chosen, reasons={m.id: ["online"] for m in chosen})
        out.append(
            {
                "nodes": n_nodes,
                "nproc": nproc,
                "chosen": chosen,
                "request": stored_request(request),
                "plan": execution_plan(launch, selection),
            }
        )
    return out


def fill_store(
    url: str, run_dir: Path, jobs: int, events: int, *, run_dirs: bool = False, seed: int = 7
) -> dict[str, Any]:
    """Fill a new store at ``url`` with ``jobs`` jobs (their attempts, nodes and ranks)
    and ``events`` events; with ``run_dirs``, a small run dir for each finished job.
    What was inserted (``job_ids`` included)."""
    from sqlalchemy import insert

    from corral.store import Attempt, Job, Node, Rank, open_store

    rng = random.Random(seed)
    began = time.monotonic()
    me = psutil.Process()
    machines = _machines()
    templates = _templates(machines, run_dir, rng)
    counts = _event_counts(jobs, events, rng)
    now = time.time()
    spacing = SPAN_DAYS * 86400.0 / jobs
    job_ids: list[str] = []
    states: dict[str, int] = {}
    created_at: list[float] = []
    store = open_store(url)
    try:
        with store.session() as s:
            s.add_all(machines)
        for first in range(0, jobs, BATCH_JOBS):
            rows: dict[Any, list[dict[str, Any]]] = {Job: [], Attempt: [], Node: [], Rank: []}
            for i in range(first, min(jobs, first + BATCH_JOBS)):
                job_id = f"j-{i:05d}-{rng.getrandbits(24):06x}"
                state = _state_of(i, rng)
                job_ids.append(job_id)
                states[state] = states.get(state, 0) + 1
                shape = templates[i % len(templates)]
                created = now - SPAN_DAYS * 86400.0 + i * spacing
                created_at.append(created)
                attempts = 2 if i % 9 == 0 and state != "planned" else 1
                _job_rows(rows, job_id, state, shape, created, attempts, run_dir, me)
                if run_dirs and state not in ("running", "planned"):
                    (run_dir / job_id / "logs").mkdir(parents=True)
                    (run_dir / job_id / "logs" / "gpu00.0.log").write_text("x" * 1024)
            with store.session() as s:
                for model in (Job, Attempt, Node, Rank):  # jobs first: the foreign keys
                    if rows[model]:
                        s.execute(insert(model), rows[model])
        _fill_events(store, job_ids, counts, created_at, rng)
    finally:
        store.close()
    return {
        "jobs": jobs,
        "events": sum(counts),
        "max_events_per_job": max(counts),
        "machines": len(machines),
        "states": states,
        "build_s": time.monotonic() - began,
        "job_ids": job_ids,
    }


def _job_rows(
    rows: dict[Any, list[dict[str, Any]]],
    job_id: str,
    state: str,
    shape: dict[str, Any],
    created: float,
    attempts: int,
    run_dir: Path,
    me: psutil.Process,
) -> None:
    """The rows of one job (as bench_serve's build_store makes them)."""
    from corral.store import Attempt, Job, Node, Rank

    ended = None if state in ("running", "planned") else created + 1800.0
    nproc, chosen = shape["nproc"], shape["chosen"]
    hosts = [m.name for m in chosen]
    world = len(hosts) * nproc
    rows[Job].append(
        {
            "id": job_id,
            "kind": "distributed",
            "state": state,
            "reason": "" if state in ("succeeded", "running") else f"{state} reason",
            "request": shape["request"],
            "plan": shape["plan"],
            "machine_ids": [m.id for m in chosen],
            "master": hosts[0],
            "world_size": world,
            "run_dir": str(run_dir / job_id),
            "created": created,
            "started": None if state == "planned" else created + 5,
            "ended": ended,
            "exit_code": None if ended is None else (0 if state == "succeeded" else 1),
            "attempt": 0 if state == "planned" else attempts - 1,
            "restarts": attempts - 1,
            "root_cause": None
            if state in ("succeeded", "running", "planned")
            else {"host": hosts[0], "rank": 0, "message": "rank 0 exited 1"},
            "last_metrics": {"rank": 0, "host": hosts[0], "step": 500, "loss": 0.5},
            "supervisor_pid": me.pid if state == "running" else None,
            "supervisor_started": me.create_time() if state == "running" else None,
            "events_offset": 0,
            "priority": 0,
        }
    )
    if state == "planned":
        return
    for number in range(attempts):
        rows[Attempt].append(
            {
                "job_id": job_id,
                "number": number,
                "started": created + 5 + number * 900,
                "ended": created + 900 + number * 900 if ended or number == 0 else None,
                "hosts": hosts,
                "world_size": world,
                "checkpoint": "/srv/ckpt/step-400.pt" if number else None,
                "record": {"cause": "rank 1 killed by SIGKILL"} if number == 0 else {},
                "restart": number + 1 < attempts,
                "decision": "restart from step 400" if number + 1 < attempts else "",
                "workload_weights": None,
            }
        )
    for k, machine in enumerate(chosen):
        rows[Node].append(
            {
                "job_id": job_id,
                "host": machine.name,
                "node_rank": k,
                "machine_id": machine.id,
                "state": "running" if ended is None else "exited",
                "detail": "",
                "started": created + 5,
                "ended": ended,
            }
        )
    for r in range(world):
        rows[Rank].append(
            {
                "job_id": job_id,
                "rank": r,
                "host": hosts[r // nproc],
                "step": 500,
                "total": 1000,
                "steps_per_s": 3.2,
                "metrics": {"loss": 0.5 + r / 100, "lr": 0.032},
                "updated": created + 600,
                "code": None if ended is None else 0,
            }
        )


def _events_of(
    job_ids: list[str], counts: list[int], created_at: list[float], rng: random.Random
) -> Iterator[tuple[str, int, float, str, dict[str, Any]]]:
    """Every event: per job a state and an attempt event, then progress reports."""
    for job_id, count, created in zip(job_ids, counts, created_at, strict=True):
        pos = 0
        for k in range(count):
            if k == 0:
                kind, data = "state", {"state": "starting", "reason": "", "attempt": 0}
            elif k == 1:
                kind, data = "attempt_started", {"number": 0, "hosts": ["gpu00"], "world_size": 8}
            else:
                kind = "progress"
                data = {
                    "host": "gpu00",
                    "rank": k % 8,
                    "step": k,
                    "total": count,
                    "metrics": {"loss": round(rng.random(), 4), "lr": 0.032},
                }
            yield job_id, pos, created + k * 0.01, kind, data
            pos += 60 + 8 * len(data)


def _fill_events(
    store: Any, job_ids: list[str], counts: list[int], created_at: list[float], rng: random.Random
) -> None:
    """The events, in large batches: ``COPY`` on PostgreSQL, executemany on SQLite."""
    from sqlalchemy import insert

    from corral.store import Event

    events = _events_of(job_ids, counts, created_at, rng)
    if store.dialect == "postgresql":
        raw = store.engine.raw_connection()
        try:
            cursor = raw.cursor()
            copy = "COPY events (job_id, pos, time, kind, data) FROM STDIN"
            with cursor.copy(copy) as sink:
                for job_id, pos, when, kind, data in events:
                    sink.write_row((job_id, pos, when, kind, json.dumps(data)))
            raw.commit()
        finally:
            raw.close()
        return
    batch: list[dict[str, Any]] = []
    for job_id, pos, when, kind, data in events:
        batch.append({"job_id": job_id, "pos": pos, "time": when, "kind": kind, "data": data})
        if len(batch) >= BATCH_EVENTS:
            with store.session() as s:
                s.execute(insert(Event), batch)
            batch = []
    if batch:
        with store.session() as s:
            s.execute(insert(Event), batch)


# -- latency -------------------------------------------------------------------------------


def measure_latency(
    url: str, root: Path, job_ids: list[str], requests: int, seed: int = 11
) -> dict[str, Any]:
    """Status, list and healthz requests, shuffled, one at a time (bench_serve's mix)."""
    rng = random.Random(seed)
    order = (
        [("status", rng.choice(job_ids)) for _ in range(requests)]
        + [("list", "")] * (requests * 2 // 5)
        + [("healthz", "")] * requests
    )
    rng.shuffle(order)
    samples: dict[str, list[float]] = {"status": [], "list": [], "healthz": []}
    errors: dict[str, int] = {}
    root.mkdir(parents=True, exist_ok=True)
    with (
        live_server(root, url, args=("--health-interval", "0")) as server,
        server.client(timeout=60) as client,
    ):
        for _ in range(20):  # warm up: connections, caches, first imports
            client.get("/healthz")
            client.get(f"/api/network/distributed/status/{rng.choice(job_ids)}")
            client.get("/api/jobs", params={"limit": 50})
        time.sleep(0.5)
        cpu0, load0 = _cpu_of(server), os.getloadavg()
        for kind, job_id in order:
            path = {
                "status": f"/api/network/distributed/status/{job_id}",
                "list": "/api/jobs",
                "healthz": "/healthz",
            }[kind]
            params = {"limit": 50} if kind == "list" else None
            began = time.perf_counter()
            resp = client.get(path, params=params)
            took = time.perf_counter() - began
            if resp.status_code != 200:
                errors[kind] = errors.get(kind, 0) + 1
                continue
            samples[kind].append(took)
        cpu, load1 = _cpu_of(server) - cpu0, os.getloadavg()
        server_log = server.log()
    return {
        "latency": {k: _latency(v) for k, v in samples.items()},
        "errors": errors,
        "server_cpu_ms_per_request": 1000.0 * cpu / len(order),
        "loadavg_1min_before_after": [load0[0], load1[0]],
        "server_log_tail": server_log.splitlines()[-5:],
    }


@contextmanager
def _database(kind: str, top: Path, pg_url: str | None, name: str) -> Iterator[str]:
    """A fresh database of ``kind``: a SQLite file under ``top``, or a new database on
    the PostgreSQL server."""
    if kind == "sqlite":
        yield f"sqlite:///{top / f'{name}.db'}"
        return
    from tests import pgserver

    assert pg_url is not None
    url = pgserver.create_database(pg_url, name)
    try:
        yield url
    finally:
        pgserver.drop_database(pg_url, name)


def measure_store(
    kind: str,
    top: Path,
    pg_url: str | None,
    jobs: int,
    events: int,
    requests: int,
    *,
    gc: bool = False,
) -> dict[str, Any]:
    """Fill a store of ``kind`` at the size, measure the latencies (then gc it)."""
    name = f"scale_{kind}_{jobs}"
    root = top / name
    run_dir = root / "runs"
    run_dir.mkdir(parents=True)
    with _database(kind, top, pg_url, name) as url:
        built = fill_store(url, run_dir, jobs, events, run_dirs=gc)
        job_ids = built.pop("job_ids")
        log(
            f"{kind}: {built['jobs']:,} jobs, {built['events']:,} events (largest job "
            f"{built['max_events_per_job']:,}), filled in {built['build_s']:.1f} s"
        )
        out: dict[str, Any] = {"store": built, **measure_latency(url, root, job_ids, requests)}
        lat = out["latency"]
        log(
            f"{kind} {jobs:,} jobs: status p50/p99 {lat['status']['p50_ms']:.2f}/"
            f"{lat['status']['p99_ms']:.2f} ms, jobs?limit=50 {lat['list']['p50_ms']:.2f}/"
            f"{lat['list']['p99_ms']:.2f} ms, healthz {lat['healthz']['p99_ms']:.2f} ms p99"
        )
        if gc:
            out["gc"] = measure_gc(url, run_dir)
    return out


# -- gc ------------------------------------------------------------------------------------


def _gc(url: str, run_dir: Path, *extra: str) -> tuple[float, str]:
    cli, _ = corral_cli()
    argv = [*cli, "serve", "gc", "--older-than", GC_AGE, "--db", url, "--run-dir", str(run_dir)]
    began = time.monotonic()
    done = subprocess.run(
        [*argv, *extra], capture_output=True, text=True, env=bench_env(), timeout=1200
    )
    took = time.monotonic() - began
    if done.returncode != 0:
        raise RuntimeError(f"corral serve gc failed: {done.stderr[-2000:]}")
    return took, done.stdout.strip().splitlines()[-1]


def _untouchable(url: str) -> dict[str, int]:
    """Events of the running, queued and planned jobs (gc must leave them)."""
    from sqlalchemy import func, select

    from corral.store import Event, Job, open_store

    with open_store(url) as store, store.session() as s:
        active = select(Job.id).where(Job.state.in_(["running", "queued", "planned"]))
        events = s.scalar(select(func.count()).where(Event.job_id.in_(active)))
        total = s.scalar(select(func.count()).select_from(Event))
    return {"active_events": int(events or 0), "events": int(total or 0)}


def measure_gc(url: str, run_dir: Path) -> dict[str, Any]:
    """``corral serve gc --older-than 30d``: a dry run, then the real one."""
    before = _untouchable(url)
    dirs_before = sum(1 for _ in run_dir.iterdir())
    dry_s, dry_line = _gc(url, run_dir, "--dry-run")
    after_dry = _untouchable(url)
    real_s, real_line = _gc(url, run_dir)
    after = _untouchable(url)
    dirs_after = sum(1 for _ in run_dir.iterdir())
    log(f"gc: dry run {dry_s:.1f} s ({dry_line}); real {real_s:.1f} s ({real_line})")
    return {
        "dry_run_s": dry_s,
        "dry_run_summary": dry_line,
        "dry_run_deleted_events": before["events"] - after_dry["events"],
        "gc_s": real_s,
        "summary": real_line,
        "events_before": before["events"],
        "events_after": after["events"],
        "run_dirs_before": dirs_before,
        "run_dirs_after": dirs_after,
        "active_events_before": before["active_events"],
        "active_events_after": after["active_events"],
    }


# -- SSE -----------------------------------------------------------------------------------


def measure_sse(top: Path, subscribers: int, rate: float, seconds: float) -> dict[str, Any]:
    """bench_serve's SSE job with ``subscribers`` streams, and ``corral run``'s stdout."""
    root = top / "sse"
    per_rank = int(rate * seconds / SSE_RANKS)
    with live_server(root) as server, server.client() as client:
        body = {"name": "sse4", "local": True, "slots": SSE_RANKS}
        client.post("/api/network/machines", json=body).raise_for_status()
        work = top / "sse-work"
        work.mkdir()
        api = sse_api(server, work, per_rank, rate, subscribers)
    cli = sse_cli(work, per_rank, rate)
    log(
        f"SSE: {subscribers} subscribers, slowest {api['min_lines_per_s'] or 0:,.0f} lines/s "
        f"(lost {api['lost']}, job {api['status']}); corral run "
        f"{cli['lines_per_s'] or 0:,.0f} lines/s (lost {cli['lost']})"
    )
    return {"api": api, "cli": cli}


# -- main ----------------------------------------------------------------------------------


def _latency_rows(
    kind: str, size: str, out: dict[str, Any], ref: dict[str, Any] | None
) -> list[dict[str, Any]]:
    rows = []
    lat = out["latency"]
    for key, route in (
        ("status", "GET distributed/status/{id}"),
        ("list", "GET /api/jobs?limit=50"),
    ):
        value, base = lat[key]["p99_ms"], lat["healthz"]["p99_ms"]
        rows.append(
            metric(
                f"{route}, {kind}, {size}: p99",
                value,
                "ms",
                f"<= {LATENCY_TARGET_MS:g} ms",
                value is not None and value <= LATENCY_TARGET_MS,
                baseline=base,
                baseline_desc="GET /healthz p99, same server, same run",
                ratio_value=ratio(value, base),
            )
        )
        if ref is not None:
            small = ref["latency"][key]["p99_ms"]
            jobs = ref["store"]["jobs"]
            events = ref["store"]["events"]
            rows.append(
                metric(
                    f"{route}, {kind}, {size}: p99 against {jobs:,} jobs (info)",
                    value,
                    "ms",
                    "-",
                    None,
                    baseline=small,
                    baseline_desc=f"p99 on {jobs:,} jobs / {events:,} events, same run",
                    ratio_value=ratio(value, small),
                )
            )
    return rows


def main(argv: list[str] | None = None) -> int:
    """Run the parts, write ``results/scale.json``, print a short summary."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=10_000)
    parser.add_argument("--events", type=int, default=1_000_000)
    parser.add_argument("--requests", type=int, default=500)
    parser.add_argument("--stores", default="sqlite,postgresql")
    parser.add_argument("--reference-jobs", type=int, default=1000)
    parser.add_argument("--reference-events", type=int, default=100_000)
    parser.add_argument("--sse-subscribers", type=int, default=100)
    parser.add_argument("--sse-rate", type=float, default=20_000.0, help="lines/s, all ranks")
    parser.add_argument("--sse-seconds", type=float, default=5.0)
    parser.add_argument("--no-sse", action="store_true")
    args = parser.parse_args(argv)
    exit_on_sigterm()
    kinds = [k.strip() for k in args.stores.split(",") if k.strip()]
    unknown = set(kinds) - {"sqlite", "postgresql"}
    if unknown:
        parser.error(f"--stores: unknown {sorted(unknown)} (sqlite, postgresql)")
    top = Path(tempfile.mkdtemp(prefix="corral-bench-scale-"))
    os.environ.update({k: v for k, v in bench_env().items() if k == "PYTHONPATH"})
    stores: dict[str, Any] = {}
    refs: dict[str, Any] = {}
    sse: dict[str, Any] | None = None
    try:
        with _postgres(kinds) as pg_url:
            for kind in kinds:
                refs[kind] = measure_store(
                    kind, top, pg_url, args.reference_jobs, args.reference_events, args.requests
                )
                stores[kind] = measure_store(
                    kind, top, pg_url, args.jobs, args.events, args.requests, gc=kind == kinds[0]
                )
        if not args.no_sse:
            sse = measure_sse(top, args.sse_subscribers, args.sse_rate, args.sse_seconds)
    finally:
        shutil.rmtree(top, ignore_errors=True)

    size = f"{args.jobs:,} jobs / {args.events:,} events"
    metrics: list[dict[str, Any]] = []
    met = True
    for kind in kinds:
        rows = _latency_rows(kind, size, stores[kind], refs[kind])
        metrics.extend(rows)
        met = met and all(r["met"] for r in rows if r["met"] is not None)
    gc = stores[kinds[0]].get("gc") if kinds else None
    if gc is not None:
        kept = gc["active_events_after"] == gc["active_events_before"]
        nothing_on_dry = gc["dry_run_deleted_events"] == 0
        metrics.append(
            metric(
                f"corral serve gc --older-than {GC_AGE}, {kinds[0]}, {size}: "
                f"{gc['events_before'] - gc['events_after']:,} events and "
                f"{gc['run_dirs_before'] - gc['run_dirs_after']:,} run dirs deleted",
                gc["gc_s"],
                "s",
                "active jobs untouched, dry run deletes nothing",
                kept and nothing_on_dry,
                baseline=gc["dry_run_s"],
                baseline_desc="the same gc with --dry-run (lists only), same run",
                ratio_value=ratio(gc["gc_s"], gc["dry_run_s"]),
            )
        )
        met = met and kept and nothing_on_dry
    sse_ratio = None
    if sse is not None:
        api, cli = sse["api"], sse["cli"]
        sse_ratio = ratio(api["min_lines_per_s"], cli["lines_per_s"])
        lost = api["lost"]
        sse_ok = sse_ratio is not None and sse_ratio >= SSE_TARGET
        metrics += [
            metric(
                f"SSE delivery, slowest of {args.sse_subscribers} subscribers, "
                f"{SSE_RANKS} ranks at {args.sse_rate:,.0f} lines/s",
                api["min_lines_per_s"],
                "lines/s",
                f">= {SSE_TARGET:g}x",
                sse_ok,
                baseline=cli["lines_per_s"],
                baseline_desc="corral run, same script, stdout read from a pipe",
                ratio_value=sse_ratio,
            ),
            metric(
                f"SSE lines lost/duplicated/broken (all {args.sse_subscribers} subscribers)",
                float(lost),
                "lines",
                "0",
                lost == 0 and api["status"] == "succeeded",
            ),
            metric(  # one shared reader per job (service/fanout): ~2 CPU-s, was ~6.5
                f"SSE: corral serve CPU while streaming the job to {args.sse_subscribers} "
                "subscribers (info)",
                api.get("server_cpu_s"),
                "CPU-s",
                "-",
                None,
            ),
        ]
        met = met and sse_ok and lost == 0
    medians = {
        f"{kind}_{key}_p99_ms": stores[kind]["latency"][key]["p99_ms"]
        for kind in kinds
        for key in ("status", "list", "healthz")
    }
    status_code = finish(
        NAME,
        {
            "title": "corral serve at scale",
            "status": "ok",
            "config": {
                "jobs": args.jobs,
                "events": args.events,
                "requests": args.requests,
                "stores": kinds,
                "reference_jobs": args.reference_jobs,
                "reference_events": args.reference_events,
                "running_jobs": RUNNING_JOBS,
                "sse_subscribers": None if args.no_sse else args.sse_subscribers,
                "sse_lines_per_s": args.sse_rate,
                "sse_seconds": args.sse_seconds,
                "gc_older_than": GC_AGE,
            },
            "samples": {"stores": stores, "reference": refs, "sse": sse},
            "medians": {**medians, "sse_ratio": sse_ratio},
            "metrics": metrics,
            "ratio": sse_ratio,
            "target": f"status and jobs?limit=50 p99 <= {LATENCY_TARGET_MS:g} ms on every "
            f"store; SSE >= {SSE_TARGET:g}x, 0 lost; gc leaves active jobs",
            "met": met,
        },
    )
    parts = [
        f"{kind} status/list p99 {stores[kind]['latency']['status']['p99_ms']:.1f}/"
        f"{stores[kind]['latency']['list']['p99_ms']:.1f} ms"
        for kind in kinds
    ]
    if sse is not None:
        parts.append(
            f"SSE x{args.sse_subscribers} {sse_ratio or 0:.2f}x, lost {sse['api']['lost']}"
        )
    print(f"scale ({size}): " + "; ".join(parts))
    return status_code


@contextmanager
def _postgres(kinds: list[str]) -> Iterator[str | None]:
    """A throwaway PostgreSQL server when ``postgresql`` is among the stores."""
    if "postgresql" not in kinds:
        yield None
        return
    from tests import pgserver

    with pgserver.throwaway_postgres() as url:
        yield url


if __name__ == "__main__":
    sys.exit(main())
