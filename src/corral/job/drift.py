"""Live throughput against the calibration: drift warnings and rebalanced weights.

A :class:`DriftMonitor` subscribes to a running job (``job.subscribe(monitor.on_event)``)
that was launched with workload weights (``JobSpec.workload_weights``). From the
``examples`` of every rank's progress reports over the last ``window`` seconds it
computes each rank's live examples/s and its share of the job's total, and
compares that share with the rank's weight: when they differ by more than
``threshold`` (20%) it emits a warning (a :class:`~corral.job.events.Message`
through ``emit``, normally ``job.emit``), once per excursion.

What the live rate means: under DDP every rank waits for the slowest at each
all-reduce, so ``examples`` alone make every rank's share equal its weight
(each processes its batch per step, in lockstep). A rank that also reports
``busy`` (seconds it spent computing since its previous report, e.g. the
forward pass, which waits for no other rank) is measured in examples per busy
second: its real speed, and a slowed rank shows up. Without ``busy`` the
monitor still catches ranks that run at their own pace.

:meth:`DriftMonitor.respec` is the engine's ``before_restart`` hook: the next
attempt's weights follow its ranks (hosts dropped by a restart included) and,
with ``rebalance=True``, are recomputed from the live rates (``--rebalance``).
Weights are fixed for an attempt (they travel in the ranks' environment), so a
rebalance takes effect at the next restart; :meth:`DriftMonitor.live_calibration`
gives a calibration file of the live rates for the next ``corral run``.

A persistent straggler feeds the rebalance too (``--rebalance`` only): a
:class:`~corral.job.events.StragglerFound` in a ``compute*`` section, scored
against the median of the other ranks (:func:`straggler_evidence`), is evidence
that its node's weight is too high. At the restart that ends the attempt, the
measured rates win when every rank reported ``busy`` (examples per busy second:
what the node does); otherwise the node's ranks keep their current weight
divided by its slowest rank's ratio (at most :data:`MAX_STRAGGLER_CORRECTION`,
:func:`straggler_rates`). The evidence is per attempt: one correction at most
per restart, never compounded.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from datetime import datetime, timezone
from pathlib import Path

from corral.cluster.model import Cluster
from corral.contract import MICRO_BATCH_FITS_ENV, STEP_OVERHEADS_ENV
from corral.diagnose.stragglers import is_compute_section, is_wait_section
from corral.errors import ConfigError
from corral.job.events import (
    AttemptStarted,
    Finished,
    JobEvent,
    Level,
    Message,
    Progress,
    StragglerFound,
)
from corral.plan.spec import JobSpec
from corral.throughput.model import Calibration, save_calibration
from corral.throughput.resolve import planned_ranks, weights_from_rates
from corral.throughput.weights import MeasuredRank, Rate, Sample, build_calibration, rate_of

__all__ = [
    "DRIFT_THRESHOLD",
    "MAX_STRAGGLER_CORRECTION",
    "Drift",
    "DriftMonitor",
    "StragglerEvidence",
    "straggler_evidence",
    "straggler_rates",
]

DRIFT_THRESHOLD = 0.20
WINDOW = 60.0
#: Seconds of reports a rank needs before it is judged (its warm-up).
MIN_SECONDS = 10.0
CHECK_EVERY = 5.0
#: A straggler divides its node's weight by its ratio, at most by this much per restart.
MAX_STRAGGLER_CORRECTION = 4.0


@dataclasses.dataclass(frozen=True)
class Drift:
    """One rank's live share against its weight."""

    rank: int
    host: str
    expected: float
    live: float

    @property
    def ratio(self) -> float:
        """Live over expected minus one: -0.3 is 30% below its share."""
        return self.live / self.expected - 1.0


@dataclasses.dataclass(frozen=True)
class StragglerEvidence:
    """A named straggler that may correct its node's weight: ``rank`` on ``host``
    spent ``ratio`` times the other ranks' median in its compute ``section``."""

    host: str
    rank: int
    section: str
    ratio: float
    step: int | None = None

    def describe(self) -> str:
        """``rank 1 on local-1, compute 3.0x the median``."""
        return f"rank {self.rank} on {self.host}, {self.section} {self.ratio:.1f}x the median"


def straggler_evidence(event: StragglerFound) -> StragglerEvidence | None:
    """The trigger policy: a straggler feeds the rebalance only when its cause is
    compute (a ``compute*`` section, never a ``wait*`` one) and it is slower than its
    peers (scored against their ``median``; a rank only slower than its own best may
    be as fast as the others); None otherwise."""
    section = event.section
    if is_wait_section(section) or not is_compute_section(section):
        return None
    if event.basis != "median" or not event.ratio > 1.0:
        return None
    return StragglerEvidence(event.host, event.rank, section, event.ratio, event.step)


def straggler_rates(
    weights: Mapping[tuple[str, int], float],
    slow: Mapping[str, float],
    cap: float = MAX_STRAGGLER_CORRECTION,
) -> dict[tuple[str, int], float]:
    """The conversion: examples/s estimates by (host, local rank) from the current
    ``weights`` (proportional to the rates they were made from) with every rank of a
    host in ``slow`` divided by that host's ratio (its slowest rank's compute time
    over the median, at most ``cap``). Its ranks carried a weighted share of the work
    and took ``ratio`` times as long as their peers for it, so that share over
    ``ratio`` is what they do in the peers' time."""
    if not cap >= 1.0:
        raise ValueError(f"the straggler correction cap must be at least 1 (got {cap:g})")
    return {
        (host, local): weight / min(max(slow.get(host, 1.0), 1.0), cap)
        for (host, local), weight in weights.items()
    }


class DriftMonitor:
    """Watches a job's live throughput per rank (a :class:`~corral.job.events.Subscriber`)."""

    def __init__(
        self,
        weights: Sequence[float],
        cluster: Cluster,
        nproc_per_node: int | None,
        *,
        emit: Callable[[JobEvent], None] | None = None,
        rebalance: bool = False,
        threshold: float = DRIFT_THRESHOLD,
        window: float = WINDOW,
        min_seconds: float = MIN_SECONDS,
        check_every: float = CHECK_EVERY,
        save_to: str | Path | None = None,
    ) -> None:
        if not threshold > 0:
            raise ConfigError(f"must be more than 0 (got {threshold:g})", option="--rebalance")
        self.weights = tuple(weights)
        self.cluster = cluster
        self.nproc_per_node = nproc_per_node
        self.emit = emit
        self.rebalance = rebalance
        self.threshold = threshold
        self.window = window
        self.min_seconds = min_seconds
        self.check_every = check_every
        self.save_to = None if save_to is None else Path(save_to)
        self.job_id = ""
        self.attempt = 0
        self.plan = planned_ranks(cluster, nproc_per_node)
        self.samples: dict[int, deque[Sample]] = {}
        self.hosts: dict[int, str] = {}
        self.first: dict[int, float] = {}
        self.drifting: dict[int, Drift] = {}
        #: this attempt's straggler evidence, the slowest rank per host (``--rebalance``)
        self.stragglers: dict[str, StragglerEvidence] = {}
        self._checked = float("-inf")

    # -- events ---------------------------------------------------------------------------

    def on_event(self, event: JobEvent) -> None:
        """Feed one job event (Progress reports; AttemptStarted resets the ranks)."""
        self.job_id = event.job_id
        if isinstance(event, AttemptStarted):
            self._new_attempt(event)
            return
        if isinstance(event, Finished):
            self._save()
            return
        if isinstance(event, StragglerFound):
            self._on_straggler(event)
            return
        if not isinstance(event, Progress):
            return
        examples = event.metrics.get("examples")
        if not isinstance(examples, int | float) or examples < 0:
            return
        busy = event.metrics.get("busy")
        busy_s = float(busy) if isinstance(busy, int | float) and busy >= 0 else None
        samples = self.samples.setdefault(event.rank, deque())
        samples.append(Sample(event.time, float(examples), busy_s))
        self.hosts[event.rank] = event.host
        self.first.setdefault(event.rank, event.time)
        while samples and samples[0].time < event.time - self.window:
            samples.popleft()
        if event.time - self._checked >= self.check_every:
            self._checked = event.time
            self.check(event.time)

    def _new_attempt(self, event: AttemptStarted) -> None:
        self.attempt = event.number
        known = {h.name: h for h in self.cluster.hosts}
        hosts = [known[name] for name in event.hosts if name in known]
        self.plan = planned_ranks(Cluster(tuple(hosts)), self.nproc_per_node)
        self.samples.clear()
        self.hosts.clear()
        self.first.clear()
        self.drifting.clear()
        self.stragglers.clear()
        self._checked = float("-inf")

    def _on_straggler(self, event: StragglerFound) -> None:
        """Keep a compute straggler as evidence against its node (``--rebalance``
        only; without it a straggler is reported and nothing more)."""
        if not self.rebalance:
            return
        evidence = straggler_evidence(event)
        if evidence is None:
            return
        known = self.stragglers.get(evidence.host)
        if known is not None and known.ratio >= evidence.ratio:
            return
        self.stragglers[evidence.host] = evidence
        if known is None:
            self._say(
                f"straggler {evidence.describe()}: the next restart moves work away from "
                f"{evidence.host} (--rebalance)",
                "info",
            )

    def _say(self, text: str, level: Level, *, now: bool = False) -> None:
        """Emit a message: after the event being handled (``now``: at once, outside
        any event's handling: at a restart, or at the end of a job, when no later turn
        of the loop may come)."""
        if self.emit is None:
            return
        message = Message(job_id=self.job_id, text=text, level=level)
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:  # no loop: called from a plain thread or a test
            loop = None
        if loop is None or now:
            self.emit(message)
        else:
            loop.call_soon(self.emit, message)

    # -- live rates -----------------------------------------------------------------------

    def live_rates(self, now: float | None = None) -> dict[int, Rate]:
        """Every rank's rate over the window, once it reported for ``min_seconds``."""
        rates: dict[int, Rate] = {}
        for rank, samples in self.samples.items():
            if not samples:
                continue
            latest = samples[-1].time if now is None else now
            if latest - self.first[rank] < self.min_seconds:
                continue
            rate = rate_of(list(samples), samples[0].time)
            if rate is not None:
                rates[rank] = rate
        return rates

    def drifts(self, now: float | None = None) -> list[Drift]:
        """Each measured rank's live share of the measured ranks' examples/s against
        its weight's share of theirs (ranks without a weight are left out)."""
        # weights are per (host, local rank): torchrun numbers ranks at its rendezvous
        planned = dict(zip(((h.name, local) for h, local in self.plan), self.weights, strict=False))
        keys = self._rank_keys()
        weight = {r: planned[keys[r]] for r in keys if keys[r] in planned}
        rates = {r: rate for r, rate in self.live_rates(now).items() if r in weight}
        if len(rates) < 2:
            return []
        total_live = sum(r.examples_per_s for r in rates.values())
        total_weight = sum(weight[r] for r in rates)
        return [
            Drift(
                rank=r,
                host=self.hosts[r],
                expected=weight[r] / total_weight,
                live=rate.examples_per_s / total_live,
            )
            for r, rate in sorted(rates.items())
        ]

    def _rank_keys(self) -> dict[int, tuple[str, int]]:
        """(host, local rank) of every reporting rank: a host's ranks in global rank
        order (torchrun and corral give a node consecutive ranks in local rank order)."""
        by_host: dict[str, list[int]] = {}
        for rank in sorted(self.hosts):
            by_host.setdefault(self.hosts[rank], []).append(rank)
        return {
            rank: (host, local)
            for host, ranks in by_host.items()
            for local, rank in enumerate(ranks)
        }

    def check(self, now: float | None = None) -> list[Drift]:
        """Warn about ranks that crossed the threshold (and say when one is back);
        returns the ranks drifting now."""
        current = {d.rank: d for d in self.drifts(now) if abs(d.ratio) > self.threshold}
        for rank, drift in current.items():
            if rank not in self.drifting:
                where = "below" if drift.ratio < 0 else "above"
                then = (
                    "the next restart uses weights from the live rates (--rebalance)"
                    if self.rebalance
                    else "pass --rebalance to re-weigh at a restart, or re-run corral calibrate"
                )
                self._say(
                    f"throughput drift: rank {rank} ({drift.host}) runs {abs(drift.ratio):.0%} "
                    f"{where} its calibrated share (live {drift.live:.3f} of the job's "
                    f"examples/s, weight {drift.expected:.3f}); {then}",
                    "warning",
                )
        for rank in set(self.drifting) - set(current):
            self._say(
                f"throughput drift: rank {rank} ({self.drifting[rank].host}) is back within "
                f"{self.threshold:.0%} of its calibrated share",
                "info",
            )
        self.drifting = current
        return list(current.values())

    # -- rebalancing ----------------------------------------------------------------------

    def _local_rates(self) -> dict[tuple[str, int], float]:
        """Live examples/s by (host, local rank): a host's ranks in global rank order
        (torchrun and corral give a node consecutive ranks in local rank order)."""
        rates = self.live_rates()
        return {
            key: rates[rank].examples_per_s
            for rank, key in self._rank_keys().items()
            if rank in rates
        }

    def rebalanced_weights(self, cluster: Cluster | None = None) -> tuple[float, ...] | None:
        """Weights from the live rates for ``cluster``'s ranks (default: the monitor's);
        None when some planned rank has no live rate yet."""
        target = cluster or self.cluster
        try:
            return weights_from_rates(self._local_rates(), target, self.nproc_per_node)
        except ConfigError:
            return None

    def _remapped(self, cluster: Cluster) -> tuple[float, ...]:
        """The current weights of the ranks ``cluster`` still plans, renormalised."""
        current = dict(zip(((h.name, local) for h, local in self.plan), self.weights, strict=False))
        return weights_from_rates(current, cluster, self.nproc_per_node)

    def respec(self, spec: JobSpec, cluster: Cluster) -> JobSpec:
        """The ``before_restart`` hook: ``spec`` with the next attempt's weights."""
        if not spec.workload_weights:
            return spec
        weights: tuple[float, ...] | None = None
        if self.rebalance:
            if self.stragglers and not self._busy_measured():
                weights = self._straggler_weights(cluster)
            if weights is None:
                weights = self.rebalanced_weights(cluster)
                if weights is not None:
                    self._say(
                        "rebalanced workload weights from the live rates for the next "
                        "attempt: " + ", ".join(f"{w:.3f}" for w in weights),
                        "info",
                        now=True,  # before the next attempt's own lines
                    )
        if weights is None:
            weights = self._remapped(cluster)
        self.weights = weights
        self.stragglers.clear()  # one correction per attempt's evidence, never twice
        return dataclasses.replace(
            spec, workload_weights=weights, env=self._remapped_fits(spec.env, cluster)
        )

    def _remapped_fits(self, env: Mapping[str, str], cluster: Cluster) -> dict[str, str]:
        """``env`` with the micro-batch fits and step overheads of the ranks ``cluster``
        still plans."""
        out = dict(env)
        planned = planned_ranks(cluster, self.nproc_per_node)
        for name in (MICRO_BATCH_FITS_ENV, STEP_OVERHEADS_ENV):
            raw = out.pop(name, "")
            entries = [p.strip() for p in raw.split(",")] if raw else []
            if len(entries) != len(self.plan):
                continue  # none, or not this plan's: none rather than wrong ones
            per_rank = dict(zip(((h.name, local) for h, local in self.plan), entries, strict=True))
            out[name] = ",".join(per_rank.get((h.name, local), "0") for h, local in planned)
        return out

    def _busy_measured(self) -> bool:
        """Whether every rank of the attempt has a live rate in examples per busy
        second (its own speed): then the rates, not a straggler, set the weights."""
        rates = self.live_rates()
        return bool(rates) and all(
            rank in rates and all(s.busy is not None for s in self.samples[rank])
            for rank in range(len(self.plan))
        )

    def _straggler_weights(self, cluster: Cluster) -> tuple[float, ...] | None:
        """The next attempt's weights with the straggling nodes' weights divided by
        their ratios (:func:`straggler_rates`), announced; None when ``cluster``
        plans ranks the current weights do not cover."""
        current = dict(zip(((h.name, local) for h, local in self.plan), self.weights, strict=False))
        slow = {host: e.ratio for host, e in self.stragglers.items()}
        try:
            weights = weights_from_rates(
                straggler_rates(current, slow), cluster, self.nproc_per_node
            )
        except ConfigError:
            return None
        because = "; ".join(
            f"{e.describe()}: {e.host}'s weight / {min(e.ratio, MAX_STRAGGLER_CORRECTION):.1f}"
            + (" (the most per restart)" if e.ratio > MAX_STRAGGLER_CORRECTION else "")
            for e in self.stragglers.values()
        )
        self._say(
            f"rebalanced workload weights from a straggler for the next attempt ({because}): "
            + ", ".join(f"{w:.3f}" for w in weights),
            "info",
            now=True,  # before the next attempt's own lines
        )
        return weights

    def _save(self) -> None:
        """At the end of the job: the live calibration to ``save_to`` (when every rank
        of the last attempt has a rate), announced in a message."""
        if self.save_to is None:
            return
        live = self.live_calibration()
        if live is None:
            return
        try:
            save_calibration(live, self.save_to)
        except OSError as exc:
            why = f"cannot save the live calibration to {self.save_to}: {exc}"
            self._say(why, "warning", now=True)
            return
        self._say(
            f"live throughput saved to {self.save_to} (corral run --calibration "
            f"{self.save_to} uses it)",
            "info",
            now=True,
        )

    def live_calibration(self) -> Calibration | None:
        """A calibration of the live rates (``workload: live``), for ``corral run
        --calibration``; None before every rank of the attempt has a rate."""
        rates = self.live_rates()
        if not rates or set(rates) != set(range(len(self.plan))):
            return None
        by_host: dict[str, list[int]] = {}
        for rank in sorted(rates):
            by_host.setdefault(self.hosts[rank], []).append(rank)
        measured = [
            MeasuredRank(host=host, rank=rank, local_rank=local, rate=rates[rank])
            for host, ranks in by_host.items()
            for local, rank in enumerate(ranks)
        ]
        return build_calibration(
            measured,
            hosts=list(dict.fromkeys(h.name for h, _ in self.plan)),
            job_id=self.job_id,
            seconds=max(r.seconds for r in rates.values()),
            script=None,
            workload="live",
            when=datetime.now(timezone.utc),
        )
