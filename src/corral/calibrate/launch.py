"""Calibration around a job's launch: its workload weights before, its drift during.

What ``corral run --calibration FILE|auto`` and the server's supervisor process
do for a weighted job, so that neither wires it itself: :func:`weigh` gives the
spec its ranks' weights from a calibration file or from one measured now
(:func:`measure`, its job's events to the caller's subscriber);
:func:`watch_drift` attaches a :class:`~corral.job.drift.DriftMonitor` to
the job (drift warnings and rebalanced weights as ``message`` events, the live
throughput saved as ``calibration-live.json`` in the job dir; with ``rebalance``
a compute straggler's :class:`~corral.job.events.StragglerFound` also moves work
away from its node at the next restart).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from corral.calibrate.measure import CalibrateOptions, CalibrationRun, Calibrator
from corral.cluster.model import Cluster
from corral.contract import MICRO_BATCH_FITS_ENV
from corral.errors import CorralError
from corral.job.drift import DriftMonitor
from corral.job.engine import Job
from corral.plan.spec import JobSpec
from corral.signals import stop_on_signals
from corral.throughput.model import Calibration, load_calibration
from corral.throughput.resolve import fits_env, planned_ranks, resolve_fits, resolve_weights
from corral.transport.options import SshOptions

AUTO = "auto"
"""``--calibration auto``: measure with the built-in workload just before the launch."""
LIVE_FILE = "calibration-live.json"


@dataclass(frozen=True)
class Weighing:
    """A spec with its ranks' workload weights, and the calibration measured for it."""

    spec: JobSpec
    ranks: list[tuple[str, int, float]]
    """(host, local rank, weight) of every rank, in rank order."""
    measured: Calibration | None = None
    """The calibration just measured (``auto``); None when read from a file."""
    fits: tuple[int | None, ...] = ()
    """The largest micro-batch of every rank (None: no limit), in rank order."""


async def measure(calibrator: Calibrator) -> CalibrationRun | None:
    """Run ``calibrator`` with Ctrl-C / SIGTERM mapped to its interrupt; None when it
    was interrupted (its errors otherwise)."""
    with stop_on_signals(calibrator.interrupt):
        try:
            return await calibrator.run()
        except CorralError:
            if calibrator.interrupted:
                return None
            raise


def weigh(spec: JobSpec, cluster: Cluster, source: str | Calibration) -> Weighing:
    """``spec`` with the weights of a calibration (a file path, or one in hand), and the
    largest micro-batch each rank fits (``CORRAL_MICRO_BATCH_FITS``) where it has one."""
    measured = source if isinstance(source, Calibration) else None
    if not isinstance(source, Calibration):
        source = load_calibration(source)
    weights = resolve_weights(source, cluster, spec.nproc_per_node)
    fits = resolve_fits(source, cluster, spec.nproc_per_node)
    ranks = planned_ranks(cluster, spec.nproc_per_node)
    pairs = [(h.name, local, w) for (h, local), w in zip(ranks, weights, strict=True)]
    env = {k: v for k, v in spec.env.items() if k != MICRO_BATCH_FITS_ENV} | fits_env(fits)
    weighed = dataclasses.replace(spec, workload_weights=weights, env=env)
    return Weighing(weighed, pairs, measured, fits)


async def weigh_now(
    spec: JobSpec,
    cluster: Cluster,
    *,
    ssh: SshOptions,
    seconds: float,
    watch: Callable[[Calibrator], None] | None = None,
) -> Weighing | None:
    """``spec`` weighed by the built-in calibration, measured now on ``cluster`` with
    the job's interpreter, ranks and env (``watch`` sees the calibrator first, to
    subscribe to its job's events); None when Ctrl-C interrupted it."""
    options = CalibrateOptions(
        seconds=seconds,
        nproc_per_node=spec.nproc_per_node,
        python=spec.python,
        env=dict(spec.env),
        run_dir=spec.run_dir,
    )
    calibrator = Calibrator(cluster, options, ssh=ssh)
    if watch is not None:
        watch(calibrator)
    run = await measure(calibrator)
    return None if run is None else weigh(spec, cluster, run.calibration)


def watch_drift(job: Job, *, rebalance: bool = False) -> DriftMonitor | None:
    """A weighted job's drift monitor, subscribed to ``job`` (its progress reports
    and stragglers; re-weighing its restarts with ``rebalance``); None for a job
    without weights."""
    spec = job.spec
    if not spec.workload_weights:
        return None
    monitor = DriftMonitor(
        spec.workload_weights,
        job.cluster,
        spec.nproc_per_node,
        emit=job.emit,
        rebalance=rebalance,
        save_to=Path(spec.run_dir, spec.job_id, LIVE_FILE),
    )
    job.subscribe(monitor.on_event)
    job.before_restart = monitor.respec
    return monitor
