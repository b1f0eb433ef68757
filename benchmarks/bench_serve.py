"""Control plane of ``corral serve``: status latency, SSE fan-out, dispatch overhead.

Three parts, each against a real ``corral serve`` subprocess (``tests/serverlib.py``)
on loopback, every figure against a baseline measured in the same run:

* **status latency**: a SQLite store filled beforehand through
  :func:`corral.store.open_store` with 32 registered SSH machines, 1,000 jobs in
  mixed states (real execution plans from the planner, 1-4 nodes of 1-8 ranks,
  their nodes, ranks and one or two attempts) and 100,000 structured events spread
  over them. 20 of the jobs are ``running`` under a live supervisor (this
  process's pid) with a run dir that does not exist, so the server's ingest loop
  reads them every round without ever marking them lost (the steady load of a
  server with 20 running jobs). Then ``GET /api/network/distributed/status/{id}``
  on random jobs, ``GET /api/jobs?limit=50`` and ``GET /healthz`` (the baseline:
  the same HTTP stack, token middleware and event loop with no store work) are
  sent one at a time in a shuffled order from one keep-alive client; p50/p99 of
  each.
* **SSE**: one job on a registered ``local`` machine with 4 slots (python
  launcher, 4 ranks) runs ``workloads/paced_writer.py``: each rank prints
  numbered 60-byte lines at a steady pace (20,000 lines/s in all, 5 s).
  20 subscribers (threads, one HTTP connection each) follow
  ``GET /api/jobs/{id}/events`` from before the dispatch to the stream's end; every
  subscriber must get every line of every rank exactly once. Delivery rate of a
  subscriber = lines / (its last line's arrival - the first rank's start); the
  baseline is the same script under ``corral run --hosts local:1
  --nproc-per-node 4 --launcher python`` with its stdout a pipe read here
  (lines / (last line read - first rank's start)).
* **dispatch overhead**: ``workloads/report_first_step.py`` (``corral.sdk.report``
  of step 1, then one printed line; no torch) on two local machines of one slot
  each, python launcher, no pre-flight: from the plan request to the first
  ``log`` event of the job on its SSE stream (plan + dispatch + subscribe), vs
  ``corral run --hosts local:2 --nproc-per-node 1 --launcher python
  --no-preflight`` from its start to its first ``[host:rank]`` line on stdout.
  Alternating order (API, CLI, CLI, API...), median of ``--dispatch-runs`` each.

    python benchmarks/bench_serve.py [--jobs 1000] [--events 100000] [--requests 500]
                                     [--sse-subscribers 20] [--sse-rate 20000]
                                     [--sse-seconds 5] [--dispatch-runs 5]
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
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psutil
from benchlib import (
    ROOT,
    WORKLOADS,
    bench_env,
    corral_cli,
    exit_on_sigterm,
    finish,
    kill_popen,
    log,
    median,
    metric,
    ratio,
    read_stamp,
)

sys.path.insert(0, str(ROOT))
from tests.serverlib import LiveServer, live_server

NAME = "serve"
STATUS_TARGET_MS = 50.0
SSE_TARGET = 0.8
DISPATCH_TARGET = 1.15
SSE_RANKS = 4
RUNNING_JOBS = 20
WRITER = WORKLOADS / "paced_writer.py"
FIRST_STEP = WORKLOADS / "report_first_step.py"
TERMINAL = ("succeeded", "failed", "cancelled", "lost", "timed_out")


# -- the store -----------------------------------------------------------------------------


def _machines() -> list[Any]:
    from corral.store.models import Machine

    now = time.time()
    return [
        Machine(
            id=f"m-{i:010x}",
            name=f"gpu{i:02d}",
            address=f"10.0.{i // 16}.{10 + i % 16}",
            port=22,
            user="ml",
            key_path="~/.ssh/id_ed25519",
            password_env=None,
            slots=8,
            labels={"rack": "ab"[i % 2]},
            local=False,
            python=None,
            created=now - 86400,
            status="online" if i % 8 else "offline",
            last_seen=now - 30,
            last_checked=now - 30,
            last_error=None if i % 8 else "ssh: connect to host timed out",
            latency_ms=1.5 + i / 10,
            capabilities={"cpus": 64, "gpu_count": 8, "gpu_memory_min_mib": 81559},
            load={"cpu_percent": 10.0 + i, "memory_percent": 20.0},
        )
        for i in range(32)
    ]


def _state_of(i: int, rng: random.Random) -> str:
    if i < RUNNING_JOBS:
        return "running"
    return rng.choices(
        ["succeeded", "failed", "cancelled", "lost", "timed_out", "planned"],
        weights=[70, 12, 6, 4, 2, 6],
    )[0]


def _event_counts(jobs: int, events: int, rng: random.Random) -> list[int]:
    """Events per job: skewed (a few long jobs, many short ones), ``events`` in all."""
    weights = [rng.paretovariate(1.5) for _ in range(jobs)]
    scale = events / sum(weights)
    counts = [max(1, int(w * scale)) for w in weights]
    counts[0] += events - sum(counts)
    while counts[0] < 1:  # the rounding took too many: take them back from the largest
        big = max(range(1, jobs), key=lambda k: counts[k])
        counts[big] -= 1
        counts[0] += 1
    return counts


def build_store(url: str, run_dir: Path, jobs: int, events: int, seed: int = 7) -> dict[str, Any]:
    """Fill a new store at ``url``; what was inserted."""
    from corral.service.models import JobRequest, ResourceRequirements
    from corral.service.planner import Selection, execution_plan, job_description, stored_request
    from corral.service.settings import ServerSettings
    from corral.store import Attempt, Job, Node, Rank, open_store

    rng = random.Random(seed)
    started_at = time.monotonic()
    settings = ServerSettings(run_dir=run_dir)
    me = psutil.Process()
    machines = _machines()
    counts = _event_counts(jobs, events, rng)
    base = time.time() - 30 * 86400
    job_ids: list[str] = []
    states: dict[str, int] = {}
    store = open_store(url)
    try:
        with store.session() as s:
            s.add_all(machines)
        for i in range(jobs):
            job_id = f"j-{i:05d}-{rng.getrandbits(24):06x}"
            job_ids.append(job_id)
            state = _state_of(i, rng)
            states[state] = states.get(state, 0) + 1
            n_nodes = rng.choice([1, 1, 2, 2, 4])
            nproc = rng.choice([1, 2, 4, 8])
            chosen = rng.sample(machines, n_nodes)
            request = JobRequest(
                name=f"exp-{i % 37}",
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
            launch = job_description(job_id, request, chosen, settings)
            plan = execution_plan(
                launch, Selection(chosen=chosen, reasons={m.id: ["online"] for m in chosen})
            )
            created = base + i * 2000.0
            ended = None if state in ("running", "planned") else created + 1800.0
            world = n_nodes * nproc
            hosts = [m.name for m in chosen]
            attempts = 2 if i % 9 == 0 and state != "planned" else 1
            with store.session() as s:
                s.add(
                    Job(
                        id=job_id,
                        kind="distributed",
                        state=state,
                        reason="" if state in ("succeeded", "running") else f"{state} reason",
                        request=stored_request(request),
                        plan=plan,
                        machine_ids=[m.id for m in chosen],
                        master=hosts[0],
                        world_size=world,
                        run_dir=str(run_dir / job_id),  # never created: nothing to ingest
                        created=created,
                        started=None if state == "planned" else created + 5,
                        ended=ended,
                        exit_code=None if ended is None else (0 if state == "succeeded" else 1),
                        attempt=0 if state == "planned" else attempts - 1,
                        restarts=attempts - 1,
                        root_cause=None
                        if state in ("succeeded", "running", "planned")
                        else {"host": hosts[0], "rank": 0, "message": "rank 0 exited 1"},
                        last_metrics={"rank": 0, "host": hosts[0], "step": 500, "loss": 0.5},
                        supervisor_pid=me.pid if state == "running" else None,
                        supervisor_started=me.create_time() if state == "running" else None,
                        events_offset=0,
                    )
                )
                s.flush()  # the job first: the foreign keys of what follows
                if state == "planned":
                    continue
                for number in range(attempts):
                    s.add(
                        Attempt(
                            job_id=job_id,
                            number=number,
                            started=created + 5 + number * 900,
                            ended=created + 900 + number * 900 if ended or number == 0 else None,
                            hosts=hosts,
                            world_size=world,
                            checkpoint="/srv/ckpt/step-400.pt" if number else None,
                            record={"cause": "rank 1 killed by SIGKILL"} if number == 0 else {},
                            restart=number + 1 < attempts,
                            decision="restart from step 400" if number + 1 < attempts else "",
                        )
                    )
                for k, host in enumerate(hosts):
                    s.add(
                        Node(
                            job_id=job_id,
                            host=host,
                            node_rank=k,
                            machine_id=chosen[k].id,
                            state="running" if ended is None else "exited",
                            detail="",
                            started=created + 5,
                            ended=ended,
                        )
                    )
                for r in range(world):
                    s.add(
                        Rank(
                            job_id=job_id,
                            rank=r,
                            host=hosts[r // nproc],
                            step=500,
                            total=1000,
                            steps_per_s=3.2,
                            metrics={"loss": 0.5 + r / 100, "lr": 0.032},
                            updated=created + 600,
                            code=None if ended is None else 0,
                        )
                    )
        _insert_events(store, job_ids, counts, base, rng)
    finally:
        store.close()
    return {
        "jobs": jobs,
        "events": sum(counts),
        "machines": len(machines),
        "states": states,
        "build_s": time.monotonic() - started_at,
        "job_ids": job_ids,
    }


def _insert_events(
    store: Any, job_ids: list[str], counts: list[int], base: float, rng: random.Random
) -> None:
    """``counts[i]`` events of job ``i``: state and attempt events, then progress."""
    from sqlalchemy import insert

    from corral.store import Event

    rows: list[dict[str, Any]] = []
    for i, (job_id, count) in enumerate(zip(job_ids, counts, strict=True)):
        pos = 0
        when = base + i * 2000.0
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
            rows.append(
                {"job_id": job_id, "pos": pos, "time": when + k, "kind": kind, "data": data}
            )
            pos += 60 + len(json.dumps(data))
        if len(rows) >= 10_000:
            with store.session() as s:
                s.execute(insert(Event), rows)
            rows = []
    if rows:
        with store.session() as s:
            s.execute(insert(Event), rows)


# -- part 1: status latency ----------------------------------------------------------------


def _percentile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def _latency(samples: list[float]) -> dict[str, Any]:
    ms = [s * 1000.0 for s in samples]
    return {
        "n": len(ms),
        "p50_ms": _percentile(ms, 0.50),
        "p90_ms": _percentile(ms, 0.90),
        "p99_ms": _percentile(ms, 0.99),
        "max_ms": max(ms) if ms else None,
        "mean_ms": sum(ms) / len(ms) if ms else None,
    }


def measure_status(top: Path, jobs: int, events: int, requests: int) -> dict[str, Any]:
    """Part 1; latencies of the three routes and what the store held."""
    root = top / "status"
    root.mkdir()
    db = root / "corral.db"
    built = build_store(f"sqlite:///{db}", root / "runs", jobs, events)
    job_ids = built.pop("job_ids")
    log(
        f"store: {built['jobs']} jobs, {built['events']} events, built in "
        f"{built['build_s']:.1f} s ({db.stat().st_size / 2**20:.1f} MiB)"
    )
    rng = random.Random(11)
    order = (
        [("status", rng.choice(job_ids)) for _ in range(requests)]
        + [("list", "")] * (requests * 2 // 5)
        + [("healthz", "")] * requests
    )
    rng.shuffle(order)
    samples: dict[str, list[float]] = {"status": [], "list": [], "healthz": []}
    errors: dict[str, int] = {}
    # the machines are made-up SSH addresses: no background health checks of them
    with (
        live_server(root, f"sqlite:///{db}", args=("--health-interval", "0")) as server,
        server.client(timeout=30) as client,
    ):
        for _ in range(20):  # warm up: connections, caches, first imports
            client.get("/healthz")
            client.get(f"/api/network/distributed/status/{job_ids[0]}")
            client.get("/api/jobs", params={"limit": 50})
        time.sleep(0.5)
        cpu0, wall0, load0 = _cpu_of(server), time.monotonic(), os.getloadavg()
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
        cpu, wall, load1 = _cpu_of(server) - cpu0, time.monotonic() - wall0, os.getloadavg()
        running = client.get("/api/jobs", params={"status": "running", "limit": 1000}).json()
        server_log = server.log()
    return {
        "store": {**built, "db_mib": db.stat().st_size / 2**20},
        "latency": {k: _latency(v) for k, v in samples.items()},
        "errors": errors,
        # the server's own CPU time over the timed requests (ingest of the running
        # jobs included): what contention with other processes cannot inflate
        "server_cpu_s": cpu,
        "server_cpu_ms_per_request": 1000.0 * cpu / len(order),
        "timed_s": wall,
        "loadavg_1min_before_after": [load0[0], load1[0]],
        "running_after": running.get("total"),
        "server_log_tail": server_log.splitlines()[-10:],
        "samples_ms": {k: [round(x * 1000, 3) for x in v] for k, v in samples.items()},
    }


# -- part 2: SSE ---------------------------------------------------------------------------


class Subscriber(threading.Thread):
    """Follows one job's SSE stream to its end, keeping every log event's text."""

    def __init__(self, server: LiveServer, job_id: str, connected: threading.Semaphore) -> None:
        super().__init__(daemon=True)
        self.server = server
        self.job_id = job_id
        self.connected = connected
        self.logs: list[str] = []  # the JSON data of every log event, in order
        self.first_log: float | None = None
        self.last_log: float | None = None
        self.events = 0
        self.kinds: dict[str, int] = {}
        self.error: str | None = None

    def run(self) -> None:
        try:
            with (
                self.server.client(timeout=120) as client,
                client.stream("GET", f"/api/jobs/{self.job_id}/events") as resp,
            ):
                self.connected.release()
                resp.raise_for_status()
                kind = "message"
                for line in resp.iter_lines():
                    if line.startswith("event:"):
                        kind = line[6:].strip()
                    elif line.startswith("data:"):
                        self.events += 1
                        self.kinds[kind] = self.kinds.get(kind, 0) + 1
                        if kind == "log":
                            now = time.time()
                            self.first_log = self.first_log or now
                            self.last_log = now
                            self.logs.append(line[5:])
                    elif not line:
                        kind = "message"
        except Exception as exc:
            self.error = f"{type(exc).__name__}: {exc}"
            self.connected.release()


class LineCheck:
    """Every numbered line of every rank, exactly once."""

    def __init__(self, ranks: int, per_rank: int) -> None:
        self.per_rank = per_rank
        self.seen = [bytearray(per_rank) for _ in range(ranks)]
        self.lines = 0
        self.duplicates = 0
        self.broken = 0

    def add_text(self, rank: int, text: str) -> None:
        for line in text.split("\n"):
            if line:
                self.add_line(rank, line)

    def add_line(self, rank: int, line: str) -> None:
        self.lines += 1
        head, _, rest = line.partition(" ")
        number, _, pad = rest.partition(" ")
        if head != f"r{rank}" or not number.isdigit() or len(line) != 59 or pad.strip("x"):
            self.broken += 1
            return
        index = int(number)
        if index >= self.per_rank:
            self.broken += 1
        elif self.seen[rank][index]:
            self.duplicates += 1
        else:
            self.seen[rank][index] = 1

    def summary(self) -> dict[str, int]:
        missing = sum(self.per_rank - sum(s) for s in self.seen)
        return {
            "lines": self.lines,
            "expected": self.per_rank * len(self.seen),
            "missing": missing,
            "duplicates": self.duplicates,
            "broken": self.broken,
            "lost": missing + self.duplicates + self.broken,
        }


def _check_subscriber(sub: Subscriber, per_rank: int) -> dict[str, int]:
    check = LineCheck(SSE_RANKS, per_rank)
    tails: dict[int, str] = {}
    for raw in sub.logs:
        data = json.loads(raw)
        rank = int(data.get("rank", -1))
        if not 0 <= rank < SSE_RANKS:
            check.broken += 1
            continue
        text = tails.pop(rank, "") + str(data.get("text", ""))
        whole, _, partial = text.rpartition("\n")
        if partial:
            tails[rank] = partial
        check.add_text(rank, whole)
    for rank, partial in tails.items():
        check.add_line(rank, partial)
    return check.summary()


def _first_start(stamp_dir: Path) -> float | None:
    starts = [read_stamp(stamp_dir / f"start-{r}") for r in range(SSE_RANKS)]
    return min((s for s in starts if s is not None), default=None)


def sse_api(
    server: LiveServer, top: Path, per_rank: int, rate: float, subscribers: int
) -> dict[str, Any]:
    """The job under the server with ``subscribers`` SSE readers."""
    stamp_dir = top / "sse-api-stamps"
    stamp_dir.mkdir()
    with server.client() as client:
        plan = client.post(
            "/api/network/distributed/plan",
            json={
                "name": "sse",
                "script": str(WRITER),
                "args": [str(per_rank), str(rate / SSE_RANKS), str(stamp_dir)],
                "launcher": "python",
                "nproc_per_node": SSE_RANKS,
                "machine_selection": "manual",
                "selected_machines": ["sse4"],
                "preflight": False,
            },
        )
        plan.raise_for_status()
        job_id = plan.json()["job_id"]
        connected = threading.Semaphore(0)
        subs = [Subscriber(server, job_id, connected) for _ in range(subscribers)]
        for sub in subs:
            sub.start()
        for _ in subs:
            connected.acquire(timeout=30)
        time.sleep(0.3)  # every stream is past its first (empty) read of the events file
        cpu0 = _cpu_of(server)
        client.post("/api/network/distributed/dispatch", json={"job_id": job_id}).raise_for_status()
        for sub in subs:
            sub.join(120)
        cpu = _cpu_of(server) - cpu0
        status = client.get(f"/api/network/distributed/status/{job_id}").json()
    first = _first_start(stamp_dir)
    ends = [read_stamp(stamp_dir / f"end-{r}") for r in range(SSE_RANKS)]
    per_sub = []
    for sub in subs:
        got = _check_subscriber(sub, per_rank)
        span = (sub.last_log - first) if sub.last_log and first else None
        per_sub.append(
            {
                **got,
                "events": sub.events,
                "kinds": sub.kinds,
                "error": sub.error,
                "alive": sub.is_alive(),
                "lines_per_s": got["lines"] / span if span else None,
                "lag_after_writers_s": (sub.last_log - max(ends))
                if sub.last_log and None not in ends
                else None,
            }
        )
    rates = [s["lines_per_s"] for s in per_sub]
    return {
        "job_id": job_id,
        "status": status.get("status"),
        "exit_code": status.get("exit_code"),
        "writers_s": (max(ends) - first) if first and None not in ends else None,
        "server_cpu_s": cpu,
        "subscribers": per_sub,
        "lost": sum(s["lost"] for s in per_sub),
        "min_lines_per_s": min((r for r in rates if r), default=None),
        "median_lines_per_s": median(rates),
        "max_lag_s": max((s["lag_after_writers_s"] or 0.0) for s in per_sub),
    }


def _cpu_of(server: LiveServer) -> float:
    try:
        times = psutil.Process(server.proc.pid).cpu_times() if server.proc else None
    except psutil.Error:
        return 0.0
    return (times.user + times.system) if times else 0.0


def _corral_run(args: list[str], top: Path, script: Path, script_args: list[str]) -> list[str]:
    cli, _ = corral_cli()
    return [
        *cli,
        "run",
        *args,
        "--launcher",
        "python",
        "--master-port",
        "0",
        "--no-preflight",
        "--run-dir",
        str(top / "cli-runs"),
        "--",
        str(script),
        *script_args,
    ]


def _read_output(argv: list[str], cwd: Path, on_line: Callable[[str, float], None]) -> int | None:
    """Run ``argv``, calling ``on_line(line, arrival time)`` for each stdout line; its exit
    code (None when it did not exit within 60 s of its stdout's end)."""
    proc = subprocess.Popen(
        argv, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=bench_env(), cwd=cwd, text=True
    )
    try:
        assert proc.stdout is not None
        for line in proc.stdout:
            on_line(line, time.time())
        return proc.wait(60)
    except subprocess.TimeoutExpired:
        return None
    finally:
        kill_popen(proc)
        if proc.stdout is not None:
            proc.stdout.close()


def sse_cli(top: Path, per_rank: int, rate: float) -> dict[str, Any]:
    """The baseline: the same job under ``corral run``, its stdout read here."""
    stamp_dir = top / "sse-cli-stamps"
    stamp_dir.mkdir()
    argv = _corral_run(
        ["--hosts", "local:1", "--nproc-per-node", str(SSE_RANKS)],
        top,
        WRITER,
        [str(per_rank), str(rate / SSE_RANKS), str(stamp_dir)],
    )
    check = LineCheck(SSE_RANKS, per_rank)
    last = None

    def on_line(line: str, now: float) -> None:
        nonlocal last
        if line.startswith("[local-0:"):
            last = now
            prefix, _, body = line.rstrip("\n").partition("] ")
            check.add_line(int(prefix.rpartition(":")[2]), body)

    code = _read_output(argv, top, on_line)
    first = _first_start(stamp_dir)
    ends = [read_stamp(stamp_dir / f"end-{r}") for r in range(SSE_RANKS)]
    got = check.summary()
    return {
        **got,
        "exit_code": code,
        "writers_s": (max(ends) - first) if first and None not in ends else None,
        "lines_per_s": got["lines"] / (last - first) if last and first else None,
        "lag_after_writers_s": (last - max(ends)) if last and None not in ends else None,
    }


# -- part 3: dispatch overhead -------------------------------------------------------------


def dispatch_api(server: LiveServer) -> dict[str, Any]:
    """Plan + dispatch + subscribe; seconds to the first log and progress events."""
    with server.client() as client:
        began = time.time()
        plan = client.post(
            "/api/network/distributed/plan",
            json={
                "script": str(FIRST_STEP),
                "launcher": "python",
                "nproc_per_node": 1,
                "resource_requirements": {"num_machines": 2},
                "machine_selection": "manual",
                "selected_machines": ["d0", "d1"],
                "preflight": False,
            },
        )
        plan.raise_for_status()
        job_id = plan.json()["job_id"]
        planned = time.time()
        client.post("/api/network/distributed/dispatch", json={"job_id": job_id}).raise_for_status()
        dispatched = time.time()
        first_log = first_progress = None
        with client.stream("GET", f"/api/jobs/{job_id}/events") as resp:
            kind = ""
            for line in resp.iter_lines():
                if line.startswith("event:"):
                    kind = line[6:].strip()
                elif line.startswith("data:"):
                    if kind == "log" and first_log is None:
                        first_log = time.time()
                    elif kind == "progress" and first_progress is None:
                        first_progress = time.time()
        ended = time.time()
        status = client.get(f"/api/network/distributed/status/{job_id}").json()
    return {
        "job_id": job_id,
        "status": status.get("status"),
        "plan_s": planned - began,
        "dispatch_s": dispatched - planned,
        "first_line_s": first_log - began if first_log else None,
        "first_progress_s": first_progress - began if first_progress else None,
        "end_s": ended - began,
    }


def dispatch_cli(top: Path) -> dict[str, Any]:
    """``corral run`` of the same job; seconds to its first ``[host:rank]`` line."""
    argv = _corral_run(["--hosts", "local:2", "--nproc-per-node", "1"], top, FIRST_STEP, [])
    began = time.time()
    first = None

    def on_line(line: str, now: float) -> None:
        nonlocal first
        if first is None and line.startswith("[local-"):
            first = now

    code = _read_output(argv, top, on_line)
    ended = time.time()
    return {
        "exit_code": code,
        "first_line_s": first - began if first else None,
        "end_s": ended - began,
    }


def measure_live(top: Path, args: argparse.Namespace) -> dict[str, Any]:
    """Parts 2 and 3, on one server with an empty store."""
    root = top / "live"
    per_rank = int(args.sse_rate * args.sse_seconds / SSE_RANKS)
    out: dict[str, Any] = {"sse_api": [], "sse_cli": [], "dispatch_api": [], "dispatch_cli": []}
    with live_server(root) as server, server.client() as client:
        for body in (
            {"name": "sse4", "local": True, "slots": SSE_RANKS},
            {"name": "d0", "local": True, "slots": 1},
            {"name": "d1", "local": True, "slots": 1},
        ):
            client.post("/api/network/machines", json=body).raise_for_status()
        for round_no in range(args.sse_runs):
            work = top / f"sse-{round_no}"
            work.mkdir()
            api = sse_api(server, work, per_rank, args.sse_rate, args.sse_subscribers)
            out["sse_api"].append(api)
            cli = sse_cli(work, per_rank, args.sse_rate)
            out["sse_cli"].append(cli)
            log(
                f"SSE round {round_no + 1}: {args.sse_subscribers} subscribers, slowest "
                f"{api['min_lines_per_s'] or 0:,.0f} lines/s (lost {api['lost']}, job "
                f"{api['status']}); corral run stdout {cli['lines_per_s'] or 0:,.0f} lines/s "
                f"(lost {cli['lost']})"
            )
        work = top / "dispatch"
        work.mkdir()
        dispatch_api(server)  # warm-up of both sides (page cache, imports)
        dispatch_cli(work)
        for k in range(args.dispatch_runs):
            order = ("api", "cli") if k % 2 == 0 else ("cli", "api")
            for side in order:
                res = dispatch_api(server) if side == "api" else dispatch_cli(work)
                out[f"dispatch_{side}"].append(res)
            log(
                f"dispatch {k + 1}: API {out['dispatch_api'][-1]['first_line_s'] or 0:.3f} s, "
                f"corral run {out['dispatch_cli'][-1]['first_line_s'] or 0:.3f} s"
            )
        out["server_log_tail"] = server.log().splitlines()[-10:]
    return out


# -- main ----------------------------------------------------------------------------------


def _leftovers(job_ids: list[str]) -> int:
    from benchlib import job_processes

    return sum(len(job_processes(j)) for j in job_ids)


def _latency_rows(lat: dict[str, Any], store_desc: str, requests: int) -> list[dict[str, Any]]:
    """p99 (target) and p50 (info) of the status and list routes, against /healthz."""
    rows = []
    for key, route in (
        ("status", f"GET distributed/status/{{id}}, {store_desc}, {requests} requests"),
        ("list", f"GET /api/jobs?limit=50, {store_desc}"),
    ):
        for pct in ("p99", "p50"):
            value, base = lat[key][f"{pct}_ms"], lat["healthz"][f"{pct}_ms"]
            headline = pct == "p99"
            rows.append(
                metric(
                    f"{route}: {pct}" + ("" if headline else " (info)"),
                    value,
                    "ms",
                    f"<= {STATUS_TARGET_MS:g} ms" if headline else "-",
                    (value is not None and value <= STATUS_TARGET_MS) if headline else None,
                    baseline=base,
                    baseline_desc=f"GET /healthz {pct}, same run",
                    ratio_value=ratio(value, base),
                )
            )
    return rows


def main(argv: list[str] | None = None) -> int:
    """Run the three parts, write ``results/serve.json``, print a short summary."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=1000)
    parser.add_argument("--events", type=int, default=100_000)
    parser.add_argument("--requests", type=int, default=500, help="status requests (part 1)")
    parser.add_argument("--sse-subscribers", type=int, default=20)
    parser.add_argument("--sse-rate", type=float, default=20_000.0, help="lines/s, all ranks")
    parser.add_argument("--sse-seconds", type=float, default=5.0)
    parser.add_argument("--sse-runs", type=int, default=1)
    parser.add_argument("--dispatch-runs", type=int, default=5)
    args = parser.parse_args(argv)
    exit_on_sigterm()
    top = Path(tempfile.mkdtemp(prefix="corral-bench-serve-"))
    os.environ.update({k: v for k, v in bench_env().items() if k == "PYTHONPATH"})
    try:
        status = measure_status(top, args.jobs, args.events, args.requests)
        lat = status["latency"]
        log(
            "status p50/p99 {:.2f}/{:.2f} ms, jobs?limit=50 {:.2f}/{:.2f} ms, healthz "
            "{:.2f}/{:.2f} ms".format(
                *(
                    lat[k][p] or 0
                    for k in ("status", "list", "healthz")
                    for p in ("p50_ms", "p99_ms")
                )
            )
            + f"; server CPU {status['server_cpu_ms_per_request']:.2f} ms/request, load "
            + "{:.1f} -> {:.1f}".format(*status["loadavg_1min_before_after"])
        )
        live = measure_live(top, args)
        left = _leftovers(
            [r["job_id"] for r in live["sse_api"] + live["dispatch_api"] if r.get("job_id")]
        )
    finally:
        shutil.rmtree(top, ignore_errors=True)

    lat = status["latency"]
    st_p99, st_p50 = lat["status"]["p99_ms"], lat["status"]["p50_ms"]
    ls_p99, ls_p50 = lat["list"]["p99_ms"], lat["list"]["p50_ms"]
    hz_p99, hz_p50 = lat["healthz"]["p99_ms"], lat["healthz"]["p50_ms"]
    sse_rate = median(r["min_lines_per_s"] for r in live["sse_api"])
    sse_median = median(r["median_lines_per_s"] for r in live["sse_api"])
    cli_rate = median(r["lines_per_s"] for r in live["sse_cli"])
    sse_ratio = ratio(sse_rate, cli_rate)
    sse_lost = sum(r["lost"] for r in live["sse_api"])
    cli_lost = sum(r["lost"] for r in live["sse_cli"])
    api_first = median(r["first_line_s"] for r in live["dispatch_api"])
    cli_first = median(r["first_line_s"] for r in live["dispatch_cli"])
    dispatch_ratio = ratio(api_first, cli_first)
    failed_jobs = [
        r["job_id"]
        for r in live["sse_api"] + live["dispatch_api"]
        if r.get("status") != "succeeded"
    ] + ["corral run" for r in live["sse_cli"] + live["dispatch_cli"] if r.get("exit_code") != 0]
    status_met = st_p99 is not None and st_p99 <= STATUS_TARGET_MS
    list_met = ls_p99 is not None and ls_p99 <= STATUS_TARGET_MS
    sse_met = sse_ratio is not None and sse_ratio >= SSE_TARGET
    dispatch_met = dispatch_ratio is not None and dispatch_ratio <= DISPATCH_TARGET
    store_desc = f"{status['store']['jobs']:,} jobs / {status['store']['events']:,} events"
    metrics = [
        *_latency_rows(lat, store_desc, args.requests),
        metric(
            f"SSE delivery, slowest of {args.sse_subscribers} subscribers, "
            f"{SSE_RANKS} ranks at {args.sse_rate:,.0f} lines/s",
            sse_rate,
            "lines/s",
            f">= {SSE_TARGET:g}x",
            sse_met,
            baseline=cli_rate,
            baseline_desc="corral run, same script, stdout read from a pipe",
            ratio_value=sse_ratio,
        ),
        metric(
            f"SSE lines lost/duplicated/broken (all {args.sse_subscribers} subscribers)",
            float(sse_lost),
            "lines",
            "0",
            sse_lost == 0 and not failed_jobs,
        ),
        metric(
            "dispatch -> first step line, API (plan + dispatch + SSE), local:2 python",
            api_first,
            "s",
            f"ratio <= {DISPATCH_TARGET:g}x",
            dispatch_met,
            baseline=cli_first,
            baseline_desc="corral run --no-preflight, first [host:rank] line on stdout",
            ratio_value=dispatch_ratio,
        ),
        metric(
            "dispatch -> first progress event on SSE (info)",
            median(r["first_progress_s"] for r in live["dispatch_api"]),
            "s",
            "-",
            None,
            baseline=cli_first,
            baseline_desc="corral run, first [host:rank] line",
            ratio_value=ratio(
                median(r["first_progress_s"] for r in live["dispatch_api"]), cli_first
            ),
        ),
    ]
    status_code = finish(
        NAME,
        {
            "title": "corral serve control plane",
            "status": "ok" if not failed_jobs else "failed",
            "reason": f"jobs that did not succeed: {failed_jobs}" if failed_jobs else "",
            "config": {
                "jobs": args.jobs,
                "events": args.events,
                "running_jobs": RUNNING_JOBS,
                "requests": args.requests,
                "sse_subscribers": args.sse_subscribers,
                "sse_ranks": SSE_RANKS,
                "sse_lines_per_s": args.sse_rate,
                "sse_seconds": args.sse_seconds,
                "sse_runs": args.sse_runs,
                "dispatch_runs": args.dispatch_runs,
                "store": "sqlite",
            },
            "samples": {"status": status, **live, "job_processes_left": left},
            "medians": {
                "status_p50_ms": st_p50,
                "status_p99_ms": st_p99,
                "list_p50_ms": ls_p50,
                "list_p99_ms": ls_p99,
                "healthz_p50_ms": hz_p50,
                "healthz_p99_ms": hz_p99,
                "sse_slowest_lines_per_s": sse_rate,
                "sse_median_lines_per_s": sse_median,
                "cli_lines_per_s": cli_rate,
                "sse_lost": sse_lost,
                "cli_lost": cli_lost,
                "dispatch_api_first_line_s": api_first,
                "dispatch_cli_first_line_s": cli_first,
            },
            "metrics": metrics,
            "ratio": dispatch_ratio,
            "target": f"status p99 <= {STATUS_TARGET_MS:g} ms; SSE >= {SSE_TARGET:g}x, 0 lost; "
            f"dispatch <= {DISPATCH_TARGET:g}x",
            "met": status_met and list_met and sse_met and dispatch_met and sse_lost == 0,
        },
    )
    print(
        f"serve: status p50/p99 {st_p50 or 0:.2f}/{st_p99 or 0:.2f} ms (healthz "
        f"{hz_p50 or 0:.2f}/{hz_p99 or 0:.2f}), jobs?limit=50 {ls_p50 or 0:.2f}/"
        f"{ls_p99 or 0:.2f} ms; SSE {sse_rate or 0:,.0f} vs {cli_rate or 0:,.0f} lines/s "
        f"({sse_ratio or 0:.2f}x, lost {sse_lost}); dispatch {api_first or 0:.3f} vs "
        f"{cli_first or 0:.3f} s ({dispatch_ratio or 0:.2f}x)"
    )
    return status_code


if __name__ == "__main__":
    sys.exit(main())
