"""``corral.actors``: message round trip, payload throughput and start-up.

* **round trip** (local, no root needed): a small message from the coordinator to
  one local worker (``Worker(echo)``) and back, median over ``--echoes`` echoes
  per round, vs a ``multiprocessing.Pipe`` ping-pong of the same message between
  two processes (the floor), and vs a Ray actor when ``import ray`` works; rounds
  in alternating order; target <= 3x the pipe.
* **throughput** (netns testbed): a 64 MiB ``bytes`` message to a worker on tb1,
  from ``send`` until the worker's reply (its length) is back, vs ``scp -F
  ssh_config FILE tb1:/tmp/x`` of the same bytes over the same link (the whole
  command, as a user runs it; scp of a 1-byte file, its session cost, is recorded
  too); target >= 0.8x scp's MiB/s.
* **start** (netns testbed): ``Cluster.start`` of 2 hosts x 2 workers (tb1, tb2),
  until every handle is ready, vs a plain fan-out of 4 parallel ``ssh -F
  ssh_config tbN python -c pass`` (2 per host, the same interpreter); alternating
  order; target <= 2x.

The testbed part brings up its own 2-host testbed (needs root; waits while tests
hold the testbed); without it only the round trip is measured (the other rows
say why).

    python benchmarks/bench_actors.py [--echoes 2000] [--rounds 5] [--runs 5] [--no-testbed]
"""

from __future__ import annotations

import argparse
import multiprocessing
import multiprocessing.connection
import os
import shutil
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from benchlib import (
    PYTHON,
    exit_on_sigterm,
    finish,
    log,
    median,
    metric,
    ratio,
    shared_tmpdir,
)

NAME = "actors"
HOSTS = ("tb1", "tb2")
WORKERS_PER_HOST = 2
ROUND_TRIP_TARGET = 3.0
THROUGHPUT_TARGET = 0.8
START_TARGET = 2.0
PAYLOAD_MB = 64
WARMUP = 200
TIMEOUT = 120.0
MESSAGE = ("step", 12345, 0.5)


# -- what the workers run (loaded on each host from this file) --------------------------


def echo(handle: Any) -> None:
    """Send every message back."""
    while True:
        handle.send(handle.recv())


def measure_length(handle: Any) -> None:
    """Answer every message with its length (the payload does not travel back)."""
    while True:
        handle.send(len(handle.recv()))


def _pong(conn: multiprocessing.connection.Connection) -> None:
    """The pipe baseline's other process: send every message back until None."""
    while (msg := conn.recv()) is not None:
        conn.send(msg)


# -- round trip -------------------------------------------------------------------------


def _timed_echoes(send: Callable[[Any], None], recv: Callable[[], Any], n: int) -> list[float]:
    """Microseconds of ``n`` round trips of MESSAGE (after WARMUP untimed ones)."""
    for _ in range(WARMUP):
        send(MESSAGE)
        recv()
    samples = []
    clock = time.perf_counter
    for _ in range(n):
        started = clock()
        send(MESSAGE)
        recv()
        samples.append((clock() - started) * 1e6)
    return samples


def pipe_round_trips(n: int) -> list[float]:
    """The floor: a ``multiprocessing.Pipe`` ping-pong with a spawned process."""
    ctx = multiprocessing.get_context("spawn")
    mine, theirs = ctx.Pipe()
    proc = ctx.Process(target=_pong, args=(theirs,), daemon=True)
    proc.start()
    try:
        return _timed_echoes(mine.send, mine.recv, n)
    finally:
        mine.send(None)
        proc.join(10)
        if proc.is_alive():
            proc.kill()


def actor_round_trips(n: int) -> list[float]:
    """Coordinator <-> one local worker (``Worker(echo)``)."""
    from corral.actors import Worker

    with Worker(echo, echo=False, run_dir=None) as worker:
        return _timed_echoes(worker.send, lambda: worker.recv(timeout=TIMEOUT), n)


def ray_round_trips(n: int) -> list[float] | None:
    """A Ray actor's echo method (None when Ray is not installed)."""
    try:
        import ray  # type: ignore[import-not-found]
    except ImportError:
        return None

    @ray.remote
    class Echo:
        def echo(self, msg: Any) -> Any:
            return msg

    ray.init(num_cpus=1, include_dashboard=False, log_to_driver=False)
    try:
        actor = Echo.remote()  # type: ignore[attr-defined]
        box: list[Any] = []

        def send(msg: Any) -> None:
            box.append(actor.echo.remote(msg))

        return _timed_echoes(send, lambda: ray.get(box.pop()), n)
    finally:
        ray.shutdown()


def round_trip(echoes: int, rounds: int) -> dict[str, Any]:
    """Every method once per round, in alternating order; medians in microseconds."""
    methods: dict[str, Callable[[int], list[float] | None]] = {
        "pipe": pipe_round_trips,
        "actor": actor_round_trips,
    }
    samples: dict[str, list[float]] = {"pipe": [], "actor": []}
    per_round: list[dict[str, float]] = []
    for round_no in range(rounds):
        order = list(methods) if round_no % 2 == 0 else list(reversed(methods))
        medians = {}
        for method in order:
            got = methods[method](echoes)
            assert got is not None
            samples[method].extend(got)
            medians[method] = statistics.median(got)
        per_round.append({**medians, "ratio": medians["actor"] / medians["pipe"]})
        log(f"round trip round {round_no + 1}: {per_round[-1]}")
    ray_samples = ray_round_trips(echoes)
    result: dict[str, Any] = {
        "pipe_us": statistics.median(samples["pipe"]),
        "actor_us": statistics.median(samples["actor"]),
        "ray_us": statistics.median(ray_samples) if ray_samples else None,
        "per_round": per_round,
        "p90": {k: statistics.quantiles(v, n=10)[-1] for k, v in samples.items()},
        "ray": "measured" if ray_samples else "not installed (import ray failed)",
    }
    return result


# -- the testbed ------------------------------------------------------------------------


def _ssh_fanout(tb: Any) -> float:
    """Seconds until 4 parallel ``ssh tbN python -c pass`` (2 per host) have exited."""
    argvs = [tb.ssh_argv(h, PYTHON, "-c", "pass") for h in HOSTS for _ in range(WORKERS_PER_HOST)]
    started = time.perf_counter()
    procs = [subprocess.Popen(a, stdin=subprocess.DEVNULL) for a in argvs]
    codes = [p.wait(timeout=TIMEOUT) for p in procs]
    elapsed = time.perf_counter() - started
    if any(codes):
        raise RuntimeError(f"ssh fan-out failed: exit codes {codes}")
    return elapsed


def _cluster(tb: Any, nodes: list[tuple[str, int]]) -> Any:
    from corral.actors import Cluster, NodeConfig
    from corral.transport.options import SshOptions

    return Cluster(
        [NodeConfig(host, n) for host, n in nodes],
        SshOptions(config=str(tb.ssh_config)),
        run_dir=None,
        echo=False,
    )


def _cluster_start(tb: Any) -> float:
    """Seconds of ``cluster.start`` for 2 hosts x 2 workers (then stopped, untimed)."""
    cluster = _cluster(tb, [(h, WORKERS_PER_HOST) for h in HOSTS])
    try:
        started = time.perf_counter()
        workers = cluster.start(echo, wait_time=TIMEOUT)
        elapsed = time.perf_counter() - started
        if cluster.call("ready?", timeout=TIMEOUT) != ["ready?"] * len(workers):
            raise RuntimeError("a worker did not answer")
        return elapsed
    finally:
        cluster.stop()


def start_up(tb: Any, runs: int) -> dict[str, Any]:
    cluster_s: list[float] = []
    ssh_s: list[float] = []
    for run_no in range(runs):
        order = ("ssh", "cluster") if run_no % 2 == 0 else ("cluster", "ssh")
        for method in order:
            if method == "ssh":
                ssh_s.append(_ssh_fanout(tb))
            else:
                cluster_s.append(_cluster_start(tb))
        log(f"start run {run_no + 1}: cluster {cluster_s[-1]:.3f} s, ssh {ssh_s[-1]:.3f} s")
    return {"cluster_start_s": cluster_s, "ssh_fanout_s": ssh_s}


def _scp(tb: Any, path: Path) -> float:
    argv = ["scp", "-q", "-F", str(tb.ssh_config), "-o", "BatchMode=yes", str(path), "tb1:/tmp/x"]
    started = time.perf_counter()
    subprocess.run(argv, check=True, stdin=subprocess.DEVNULL, timeout=TIMEOUT)
    return time.perf_counter() - started


def throughput(tb: Any, top: Path, runs: int) -> dict[str, Any]:
    """64 MiB to a worker on tb1 (send -> its reply) vs scp of the same bytes."""
    payload = os.urandom(PAYLOAD_MB << 20)
    source = top / "payload.bin"
    source.write_bytes(payload)
    tiny = top / "tiny.bin"
    tiny.write_bytes(b"x")
    actor_s: list[float] = []
    scp_s: list[float] = []
    scp_tiny_s: list[float] = []
    cluster = _cluster(tb, [("tb1", 1)])
    try:
        (worker,) = cluster.start(measure_length, wait_time=TIMEOUT)
        worker.send(b"warm-up")
        worker.recv(timeout=TIMEOUT)
        for run_no in range(runs):
            order = ("scp", "actor") if run_no % 2 == 0 else ("actor", "scp")
            for method in order:
                if method == "scp":
                    scp_s.append(_scp(tb, source))
                    continue
                started = time.perf_counter()
                worker.send(payload)
                got = worker.recv(timeout=TIMEOUT)
                actor_s.append(time.perf_counter() - started)
                if got != len(payload):
                    raise RuntimeError(f"the worker got {got} bytes of {len(payload)}")
            scp_tiny_s.append(_scp(tb, tiny))
            log(f"throughput run {run_no + 1}: actor {actor_s[-1]:.3f} s, scp {scp_s[-1]:.3f} s")
    finally:
        cluster.stop()
        tb.run_on("tb1", ["rm", "-f", "/tmp/x"])
    return {"actor_s": actor_s, "scp_s": scp_s, "scp_1_byte_s": scp_tiny_s}


def testbed_part(runs: int) -> dict[str, Any]:
    """Bring up a 2-host testbed, measure start-up and throughput, take it down."""
    from corral.testbed import Testbed, exclusive, missing_requirements

    problems = missing_requirements()
    if problems:
        return {"skipped": "; ".join(problems)}
    with exclusive():  # waits while tests (or another benchmark) use the testbed
        leftover = Testbed.running()
        if leftover is not None:
            leftover.down()
        top = shared_tmpdir("corral-bench-actors-")
        tb = Testbed(top / "testbed")
        tb.up(len(HOSTS))
        try:
            return {"start": start_up(tb, runs), "throughput": throughput(tb, top, runs)}
        finally:
            tb.down()
            shutil.rmtree(top, ignore_errors=True)


# -- the result -------------------------------------------------------------------------


def _metrics(rt: dict[str, Any], bed: dict[str, Any]) -> list[dict[str, Any]]:
    rt_ratio = ratio(rt["actor_us"], rt["pipe_us"])
    rows = [
        metric(
            "small-message round trip, coordinator <-> 1 local worker (median)",
            rt["actor_us"],
            "us",
            f"<= {ROUND_TRIP_TARGET:g}x",
            rt_ratio is not None and rt_ratio <= ROUND_TRIP_TARGET,
            baseline=rt["pipe_us"],
            baseline_desc="multiprocessing.Pipe ping-pong between two processes",
            ratio_value=rt_ratio,
        )
    ]
    if rt["ray_us"] is not None:
        rows.append(
            metric(
                "small-message round trip vs a Ray actor",
                rt["actor_us"],
                "us",
                "-",
                None,
                baseline=rt["ray_us"],
                baseline_desc="Ray actor method, ray.get",
                ratio_value=ratio(rt["actor_us"], rt["ray_us"]),
            )
        )
    skipped = bed.get("skipped")
    if skipped:
        for name, target in (
            (f"{PAYLOAD_MB} MiB message to a testbed worker", f">= {THROUGHPUT_TARGET:g}x scp"),
            ("cluster.start 2 hosts x 2 workers", f"<= {START_TARGET:g}x"),
        ):
            rows.append(metric(f"{name} (skipped: {skipped})", None, "", target, None))
        return rows
    put = bed["throughput"]
    actor_mibs = PAYLOAD_MB / statistics.median(put["actor_s"])
    scp_mibs = PAYLOAD_MB / statistics.median(put["scp_s"])
    put_ratio = actor_mibs / scp_mibs
    # scp less its session (a 1-byte scp): the copy alone, for comparison only
    copy_s = statistics.median(
        [full - tiny for full, tiny in zip(put["scp_s"], put["scp_1_byte_s"], strict=True)]
    )
    copy_mibs = PAYLOAD_MB / copy_s if copy_s > 0 else None
    start = bed["start"]
    start_s = median(start["cluster_start_s"])
    ssh_s = median(start["ssh_fanout_s"])
    start_ratio = ratio(start_s, ssh_s)
    rows += [
        metric(
            f"{PAYLOAD_MB} MiB message to a worker on tb1, send -> reply (median)",
            actor_mibs,
            "MiB/s",
            f">= {THROUGHPUT_TARGET:g}x",
            put_ratio >= THROUGHPUT_TARGET,
            baseline=scp_mibs,
            baseline_desc="scp -F ssh_config FILE tb1:/tmp/x, same bytes, whole command",
            ratio_value=put_ratio,
        ),
        metric(
            f"{PAYLOAD_MB} MiB message vs scp's copy alone (scp less a 1-byte scp)",
            actor_mibs,
            "MiB/s",
            "-",
            None,
            baseline=copy_mibs,
            baseline_desc="scp time minus the time of scp of a 1-byte file, same run",
            ratio_value=ratio(actor_mibs, copy_mibs),
        ),
        metric(
            "cluster.start, 2 hosts x 2 workers, until every handle is ready (median)",
            start_s,
            "s",
            f"<= {START_TARGET:g}x",
            start_ratio is not None and start_ratio <= START_TARGET,
            baseline=ssh_s,
            baseline_desc="4 parallel ssh tbN python -c pass (2 per host)",
            ratio_value=start_ratio,
        ),
    ]
    return rows


def main(argv: list[str] | None = None) -> int:
    """Measure, write ``results/actors.json``."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--echoes", type=int, default=2000, help="timed echoes per round")
    parser.add_argument("--rounds", type=int, default=5, help="round-trip rounds")
    parser.add_argument("--runs", type=int, default=5, help="testbed runs (start, throughput)")
    parser.add_argument("--no-testbed", action="store_true", help="the round trip only")
    args = parser.parse_args(argv)
    exit_on_sigterm()
    rt = round_trip(args.echoes, args.rounds)
    bed = {"skipped": "--no-testbed"} if args.no_testbed else testbed_part(args.runs)
    metrics = _metrics(rt, bed)
    judged = [row["met"] for row in metrics if row["met"] is not None]
    status_code = finish(
        NAME,
        {
            "title": "Actors: round trip, 64 MiB throughput, cluster start",
            "status": "ok",
            "config": {
                "echoes": args.echoes,
                "warmup": WARMUP,
                "rounds": args.rounds,
                "message": repr(MESSAGE),
                "testbed_runs": args.runs,
                "hosts": list(HOSTS),
                "workers_per_host": WORKERS_PER_HOST,
                "payload_mb": PAYLOAD_MB,
            },
            "samples": {"round_trip": rt, "testbed": bed},
            "medians": {
                "actor_round_trip_us": rt["actor_us"],
                "pipe_round_trip_us": rt["pipe_us"],
                "ray_round_trip_us": rt["ray_us"],
            },
            "metrics": metrics,
            "ratio": metrics[0]["ratio"],
            "target": (
                f"round trip <= {ROUND_TRIP_TARGET:g}x pipe; {PAYLOAD_MB} MiB >= "
                f"{THROUGHPUT_TARGET:g}x scp; start <= {START_TARGET:g}x ssh fan-out"
            ),
            "met": bool(judged) and all(judged),
        },
    )
    for row in metrics:
        value, unit, base = row["value"], row["unit"], row["baseline"]
        print(f"{row['metric']}: {value} {unit} vs {base} -> {row['ratio']}")
    return status_code


if __name__ == "__main__":
    sys.exit(main())
