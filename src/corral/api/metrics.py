"""``/metrics`` (Prometheus text format): jobs by state, restarts, per-rank step and
steps/s of active jobs, the live replica groups of active in-place jobs (from their
last group event), the stragglers named in active jobs (from their straggler events),
machine health and heartbeat age, request latency.

Job and machine figures are read from the store at scrape time (a collector), so
they are right after a server restart; request latency is a histogram kept by
the app's middleware.
"""

from __future__ import annotations

import time
from collections.abc import Iterator

from prometheus_client import (
    CollectorRegistry,
    Histogram,
    disable_created_metrics,
    generate_latest,
)
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector
from sqlalchemy import Select, func, select
from sqlalchemy.orm import Session

from corral.job.events import GPU_KEY, StragglerFound, decode_event
from corral.service.ingest import rank_number
from corral.service.machines import ACTIVE_STATES
from corral.store import Store
from corral.store.models import Attempt, Event, Job, Machine, Rank

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
#: The per-rank GPU gauges: the sample's key, the metric's name and help.
_GPU_GAUGES = (
    ("util", "utilization_percent", "Utilisation (%)"),
    ("mem_used_mib", "memory_used_bytes", "Memory in use (bytes)"),
    ("temp_c", "temperature_celsius", "Temperature (Celsius)"),
)
_MIB = float(1 << 20)


class StoreCollector(Collector):
    """Figures read from the store on every scrape."""

    def __init__(self, store: Store) -> None:
        self.store = store

    def collect(self) -> Iterator[Metric]:
        jobs = GaugeMetricFamily("corral_jobs", "Jobs by state.", labels=["state"])
        restarts = CounterMetricFamily("corral_job_restarts", "Restarts over all jobs.")
        step = GaugeMetricFamily(
            "corral_rank_step",
            "Last reported step of each rank of an active job.",
            labels=["job_id", "host", "rank"],
        )
        rate = GaugeMetricFamily(
            "corral_rank_steps_per_second",
            "Steps per second of each rank of an active job.",
            labels=["job_id", "host", "rank"],
        )
        gpu = {
            key: GaugeMetricFamily(
                f"corral_rank_gpu_{name}",
                f"{text} of the GPU of each rank of an active job (NVML).",
                labels=["job_id", "host", "rank", "gpu"],
            )
            for key, name, text in _GPU_GAUGES
        }
        participants = GaugeMetricFamily(
            "corral_job_participants",
            "Replica groups training now in an active job with in-place recovery (torchft's "
            "quorum), as its last group change left them.",
            labels=["job_id"],
        )
        straggler = GaugeMetricFamily(
            "corral_rank_straggler_ratio",
            "A rank named a straggler in an active job's current attempt: its section's "
            "time over the reference (the other ranks' median, or its own best) when it "
            "was last named.",
            labels=["job_id", "host", "rank", "section"],
        )
        up = GaugeMetricFamily(
            "corral_machine_up", "1 when the last check saw the machine online.", labels=["machine"]
        )
        age = GaugeMetricFamily(
            "corral_machine_heartbeat_age_seconds",
            "Seconds since the machine last answered.",
            labels=["machine"],
        )
        now = time.time()
        with self.store.session() as s:
            for state, count in s.execute(select(Job.state, func.count()).group_by(Job.state)):
                jobs.add_metric([state], float(count))
            restarts.add_metric([], float(s.scalar(select(func.sum(Job.restarts))) or 0))
            active = select(Job.id).where(Job.state.in_(ACTIVE_STATES))
            for r in s.scalars(select(Rank).where(Rank.job_id.in_(active))):
                labels = [r.job_id, r.host, str(rank_number(r.rank))]
                if r.step is not None:
                    step.add_metric(labels, float(r.step))
                if r.steps_per_s is not None:
                    rate.add_metric(labels, float(r.steps_per_s))
                sample = (r.metrics or {}).get(GPU_KEY)
                if isinstance(sample, dict):
                    for key, family in gpu.items():
                        value = sample.get(key)
                        if isinstance(value, (int, float)):
                            scale = _MIB if key == "mem_used_mib" else 1
                            family.add_metric([*labels, str(sample.get("index"))], value * scale)
            for job_id, groups in sorted(_participants(s, active).items()):
                participants.add_metric([job_id], groups)
            for (job_id, host, rank, section), ratio in sorted(_stragglers(s, active).items()):
                straggler.add_metric([job_id, host, str(rank), section], ratio)
            for m in s.scalars(select(Machine)):
                up.add_metric([m.name], 1.0 if m.status == "online" else 0.0)
                if m.last_seen is not None:
                    age.add_metric([m.name], max(0.0, now - m.last_seen))
        yield from (jobs, restarts, step, rate, participants, straggler, *gpu.values(), up, age)


def _participants(s: Session, active: Select[str]) -> dict[str, float]:
    """The live replica groups of each active in-place job: its current attempt's
    groups, then as its group events since that attempt's start left them."""
    live: dict[str, float] = {}
    since: dict[str, float] = {}
    for job_id, launch, started, hosts in s.execute(
        select(Job.id, Job.launch, Attempt.started, Attempt.hosts)
        .join(Attempt, (Attempt.job_id == Job.id) & (Attempt.number == Job.attempt))
        .where(Job.id.in_(active))
    ):
        options = (launch or {}).get("options") or {}
        if options.get("recovery") == "in-place":
            live[job_id], since[job_id] = float(len(hosts or [])), started
    for job_id, when, data in s.execute(
        select(Event.job_id, Event.time, Event.data)
        .where(Event.kind == "group", Event.job_id.in_(active))
        .order_by(Event.pos)
    ):
        count = (data or {}).get("participants")
        if when < since.get(job_id, 0.0) or isinstance(count, bool) or not isinstance(count, int):
            continue
        live[job_id] = float(count)  # the last change wins
    return live


def _stragglers(s: Session, active: Select[str]) -> dict[tuple[str, str, int, str], float]:
    """(job, host, rank, section) -> ratio of each straggler named in an active job's
    current attempt (the supervisor scores each attempt afresh), the last naming wins."""
    since = {
        job_id: started
        for job_id, started in s.execute(
            select(Job.id, Attempt.started)
            .join(Attempt, (Attempt.job_id == Job.id) & (Attempt.number == Job.attempt))
            .where(Job.id.in_(active))
        )
    }
    found: dict[tuple[str, str, int, str], float] = {}
    for job_id, when, data in s.execute(
        select(Event.job_id, Event.time, Event.data)
        .where(Event.kind == "straggler", Event.job_id.in_(active))
        .order_by(Event.pos)
    ):
        event = decode_event({**(data or {}), "kind": "straggler", "time": when}, job_id)
        if isinstance(event, StragglerFound) and when >= since.get(job_id, 0.0):
            found[(job_id, event.host, event.rank, event.section)] = event.ratio
    return found


class Metrics:
    """The app's registry: the store collector and the request-latency histogram."""

    def __init__(self, store: Store) -> None:
        # no ``*_created`` series: a timestamp per counter and histogram child is noise
        # (prometheus_client's switch is process-wide; corral keeps no other registry)
        disable_created_metrics()  # type: ignore[no-untyped-call]
        self.registry = CollectorRegistry(auto_describe=True)
        self.registry.register(StoreCollector(store))
        self.latency = Histogram(
            "corral_http_request_duration_seconds",
            "Time to answer an API request.",
            ["method", "route", "status"],
            registry=self.registry,
            buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 10),
        )

    def render(self) -> bytes:
        """The text exposition."""
        return generate_latest(self.registry)
