"""Measuring every rank's examples/s at once, through the job engine.

:class:`Calibrator` runs one job (``python`` launcher: corral starts each rank
itself, so each rank is known by host and local rank) with
``CORRAL_CALIBRATE=1`` on every rank: the user's script, or the built-in
reference workload (:mod:`corral.calibrate.reference`). It collects the
``examples`` of every rank's progress reports; once every rank has reported, it
lets the job run ``seconds`` more, then stops it (the engine's teardown: nothing
is left on any host). The first :data:`WARMUP_FRACTION` of that window is
warm-up, not counted. A script that ends on its own before the window is over
is measured over what it reported: each rank over its own reports after its own
warm-up (the notes say so); too few of them is an error saying that the script
ended first. A rank that probed the largest micro-batch it fits
(``sdk.probe_fit``; the reference workload does on a GPU, or under a declared
memory cap, ``CORRAL_MEM_CAP_MB``) reports it as the ``fits`` metric, recorded
per rank. The result is a :class:`~corral.throughput.model.Calibration`,
saved as ``<run_dir>/<job-id>/calibration.json`` and ``<run_dir>/calibration-latest.json``.

On SSH hosts the reference workload is first written to
``~/.corral/calibrate/reference-<hash>.py`` on each host (its corral may be
installed anywhere) and run from there; ``local:N`` nodes run it in place.
"""

from __future__ import annotations

import asyncio
import hashlib
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

from corral.cluster.model import Cluster, Host
from corral.contract import CALIBRATE_ENV, CALIBRATE_SECONDS_ENV, MEM_CAP_ENV
from corral.errors import ConfigError, JobFailed, LaunchError
from corral.job.build import ready_job
from corral.job.describe import JobDescription, JobOptions
from corral.job.engine import Job
from corral.job.events import JobEvent, Progress, Subscriber
from corral.job.ids import new_job_id
from corral.job.result import JobResult
from corral.job.states import JobState
from corral.plan.spec import JobSpec
from corral.throughput.model import Calibration, save_calibration
from corral.throughput.resolve import planned_ranks, resolve_weights
from corral.throughput.weights import MeasuredRank, Sample, build_calibration, rate_of
from corral.transport.base import Transport
from corral.transport.choose import transport_for
from corral.transport.options import SshOptions

__all__ = [
    "DEFAULT_SECONDS",
    "LATEST",
    "CalibrateOptions",
    "CalibrationRun",
    "Calibrator",
    "calibrate",
    "calibrate_then_weights",
]

DEFAULT_SECONDS = 30.0
#: Seconds every rank has to send its first report (imports, data loading).
START_BUDGET = 180.0
WARMUP_FRACTION = 0.10
#: The stable copy of the newest calibration, in the run dir.
LATEST = "calibration-latest.json"
REMOTE_DIR = "~/.corral/calibrate"
REFERENCE = Path(__file__).with_name("reference.py")
GRACE = 5.0
_EOF = "CORRAL_REFERENCE_EOF"


@dataclass(frozen=True)
class CalibrateOptions:
    """What to measure and how (the options of ``corral calibrate``)."""

    seconds: float = DEFAULT_SECONDS
    command: Sequence[str] = ()
    """The script and its arguments; empty: the built-in reference workload."""
    nproc_per_node: int | None = None
    python: str | None = None
    workdir: str | None = None
    env: Mapping[str, str] = field(default_factory=dict)
    run_dir: str = "runs"
    job_id: str | None = None
    threads: int | None = None
    """torch threads per rank of the reference workload (default: cores / ranks)."""
    mem_caps: Mapping[str, float] = field(default_factory=dict)
    """Host name -> its declared memory in MiB (``--mem-cap HOST=MB``): its ranks get
    ``CORRAL_MEM_CAP_MB`` and probe the largest micro-batch that fits under it."""

    def __post_init__(self) -> None:
        if not 1 <= self.seconds <= 3600:
            raise ConfigError(f"must be 1 to 3600 (got {self.seconds:g})", option="--seconds")
        for host, cap in self.mem_caps.items():
            if not cap > 0:
                raise ConfigError(
                    f"{host}: a memory cap must be a positive number of MiB (got {cap:g})",
                    option="--mem-cap",
                )
        if self.threads is not None and self.threads < 1:
            raise ConfigError(f"must be at least 1 (got {self.threads})", option="--threads")


@dataclass(frozen=True)
class CalibrationRun:
    """A finished calibration and where it was saved."""

    calibration: Calibration
    path: Path
    latest: Path


def _shell_writer(source: str, name: str) -> str:
    """A POSIX sh program that writes ``source`` to ``REMOTE_DIR/name`` (owner-only,
    atomically; kept when already there: the name carries the content's hash)."""
    if f"\n{_EOF}\n" in f"\n{source}\n":
        raise ValueError("the reference source contains the here-document delimiter")
    body = source if source.endswith("\n") else source + "\n"
    return (
        'set -e; umask 077; d="$HOME/.corral/calibrate"; mkdir -p "$d"; '
        f'f="$d/{name}"; if [ ! -f "$f" ]; then t="$f.$$.tmp"; '
        f"cat > \"$t\" <<'{_EOF}'\n{body}{_EOF}\n"
        'mv "$t" "$f"; fi\n'
    )


async def ship_reference(transport: Transport, hosts: Sequence[Host]) -> str:
    """Write the reference workload on every host; its file name under REMOTE_DIR."""
    from corral.fleet.fanout import run_on_hosts

    source = REFERENCE.read_text(encoding="utf-8")
    name = f"reference-{hashlib.sha256(source.encode()).hexdigest()[:12]}.py"
    results = await run_on_hosts(
        transport, hosts, ["sh", "-c", _shell_writer(source, name)], timeout=60, capture_limit=2000
    )
    for result in results:
        if result.error is not None:
            raise result.error
        if result.exit_code != 0:
            why = result.stderr.decode("utf-8", "replace").strip() or f"exit {result.exit_code}"
            raise LaunchError(
                f"cannot write the reference workload to {REMOTE_DIR}: {why}", host=result.host
            )
    return name


class _Collector:
    """Keeps every rank's samples and stops the job ``seconds`` after all reported."""

    def __init__(self, ranks: Mapping[int, tuple[str, int]], seconds: float) -> None:
        self.ranks = ranks
        self.seconds = seconds
        self.samples: dict[int, list[Sample]] = {r: [] for r in ranks}
        self.fits: dict[int, int] = {}
        self._last_step: dict[int, int] = {}
        self.window_start: float | None = None
        self.window_end: float | None = None
        self.stopping = False
        self.stop: Callable[[], None] = lambda: None
        self._timer: asyncio.TimerHandle | None = None

    def on_event(self, event: JobEvent) -> None:
        if not isinstance(event, Progress) or event.rank not in self.samples:
            return
        fits = event.metrics.get("fits")
        if isinstance(fits, int | float) and fits >= 1:  # the probed micro-batch (sdk.probe_fit)
            self.fits[event.rank] = int(fits)
        examples = event.metrics.get("examples")
        if not isinstance(examples, int | float) or examples < 0 or self.stopping:
            return
        # ranks run alone here: the time between reports is the real cost of a step
        # (a ``busy`` figure, part of a step, is for the drift monitor's lockstep runs);
        # the steps a report covers (its step less the previous one) let a script that
        # varies its batch separate a fixed step cost from the per-example rate
        previous = self._last_step.get(event.rank)
        steps = None if event.step is None or previous is None else event.step - previous
        if event.step is not None:
            self._last_step[event.rank] = event.step
        self.samples[event.rank].append(Sample(event.time, float(examples), steps=steps))
        if self.window_start is None and all(self.samples.values()):
            self.window_start = event.time
            loop = asyncio.get_running_loop()
            self._timer = loop.call_later(self.seconds, self._end_window)

    def _end_window(self) -> None:
        self.stopping = True
        self.window_end = self.window_start + self.seconds if self.window_start else None
        self.stop()

    def cancel(self) -> None:
        if self._timer is not None:
            self._timer.cancel()

    def silent(self) -> list[int]:
        """Ranks that never reported examples."""
        return [r for r, samples in self.samples.items() if not samples]

    def elapsed(self) -> float:
        """Seconds from the first report of any rank to the last."""
        times = [s.time for samples in self.samples.values() for s in samples]
        return max(times) - min(times) if times else 0.0

    def early_note(self) -> str | None:
        """What the notes say when the script ended before the window was over."""
        if self.stopping:
            return None
        return (
            f"The script ended {self.elapsed():.1f} s after its first report, before the "
            f"{self.seconds:g} s measuring window was over: each rank was measured over "
            "its own reports after its warm-up. For steadier figures let it run until "
            "corral stops it (more steps while sdk.calibrating())."
        )

    def _warmup_until(self, rank: int) -> float:
        """When ``rank``'s warm-up ends: the first tenth of the common window once it
        was over; of the rank's own reports when the script ended first (ranks run
        alone here: one may be done before another starts)."""
        if self.stopping and self.window_start is not None and self.window_end is not None:
            start, end = self.window_start, self.window_end
        else:
            samples = self.samples[rank]
            start, end = samples[0].time, samples[-1].time
        return start + WARMUP_FRACTION * max(0.0, end - start)

    def measured(self) -> list[MeasuredRank]:
        """Every rank's rate; JobFailed naming a rank without one."""
        out = []
        for rank, (host, local) in sorted(self.ranks.items()):
            samples = self.samples[rank]
            rate = rate_of(samples, self._warmup_until(rank)) if samples else None
            if rate is None:
                sent = f"rank {rank} on {host} sent {len(samples)} report(s) with examples"
                if self.stopping:
                    why = (
                        f"{sent} but none after the warm-up: report more often, or pass a "
                        "longer --seconds"
                    )
                else:
                    why = (
                        f"{sent}, too few to measure: the script ended "
                        f"{self.elapsed():.1f} s after its first report, before the "
                        f"{self.seconds:g} s measuring window was over (a longer --seconds "
                        "cannot help). Let it run until corral stops it: more steps while "
                        "sdk.calibrating() is true, or report more often"
                    )
                raise JobFailed(why, host=host, rank=rank)
            out.append(
                MeasuredRank(
                    host=host, rank=rank, local_rank=local, rate=rate, fits=self.fits.get(rank)
                )
            )
        return out


def _silent_error(collector: _Collector) -> JobFailed:
    silent = collector.silent()
    names = ", ".join(f"{collector.ranks[r][0]}:{r}" for r in silent)
    host, _ = collector.ranks[silent[0]]
    return JobFailed(
        f"no examples reported by {names}: the script must call "
        "sdk.report(step, examples=N) for each step (see sdk.calibrating())",
        host=host,
        rank=silent[0],
    )


def _failure(result: JobResult) -> JobFailed:
    root = result.root_cause
    if root is None:
        return JobFailed(f"the calibration job ended {result.state.value}: {result.reason}")
    lines = (root.traceback or "").splitlines() or list(root.stderr_tail)
    last = next((line.strip() for line in reversed(lines) if line.strip()), "")
    return JobFailed(
        f"the calibration job failed: {root.message}" + (f": {last}" if last else ""),
        host=root.host,
        rank=root.rank,
        exit_code=root.code,
        signal_name=root.signal,
        stderr_tail=root.stderr_tail,
    )


def _with_caps(cluster: Cluster, caps: Mapping[str, float]) -> Cluster:
    """``cluster`` with each capped host's ``CORRAL_MEM_CAP_MB`` in its env (its ranks
    get it); ConfigError (``--mem-cap``) naming a host that is not in the cluster."""
    names = {h.name for h in cluster.hosts}
    unknown = sorted(set(caps) - names)
    if unknown:
        raise ConfigError(
            f"{', '.join(unknown)} not in the cluster (hosts: {', '.join(sorted(names))})",
            option="--mem-cap",
        )
    if not caps:
        return cluster
    hosts = [
        replace(h, env={**h.env, MEM_CAP_ENV: f"{caps[h.name]:g}"}) if h.name in caps else h
        for h in cluster.hosts
    ]
    return replace(cluster, hosts=tuple(hosts))


class Calibrator:
    """One calibration run: :meth:`subscribe` to its job's events, ``await run()``,
    :meth:`interrupt` to give up (Ctrl-C)."""

    def __init__(
        self,
        cluster: Cluster,
        options: CalibrateOptions | None = None,
        *,
        ssh: SshOptions | None = None,
        transport: Transport | None = None,
    ) -> None:
        self.cluster = cluster
        self.options = options or CalibrateOptions()
        self.ssh = ssh or SshOptions()
        self.job_id = self.options.job_id or f"calibrate-{new_job_id()}"
        self.cluster = _with_caps(cluster, self.options.mem_caps)
        self._transport = transport
        self._subscribers: list[Subscriber] = []
        self.job: Job | None = None
        self.interrupted = False
        ranks = planned_ranks(cluster, self.options.nproc_per_node)
        self.collector = _Collector(
            {rank: (host.name, local) for rank, (host, local) in enumerate(ranks)},
            self.options.seconds,
        )

    @property
    def stopping(self) -> bool:
        """True once the measurement window is over and the job is being stopped."""
        return self.collector.stopping

    def subscribe(self, subscriber: Subscriber) -> None:
        """Send the calibration job's events to ``subscriber``."""
        self._subscribers.append(subscriber)

    def interrupt(self) -> None:
        """Stop the calibration without a result (a second call kills now)."""
        self.interrupted = True
        if self.job is not None:
            self.job.stop()

    async def _description(self, transport: Transport) -> JobDescription:
        """The calibration job as every job is described (``python`` launcher, no
        pre-flight, a short teardown grace), the reference workload shipped first to
        SSH hosts."""
        opts = self.options
        env = {**opts.env, CALIBRATE_ENV: "1", CALIBRATE_SECONDS_ENV: f"{opts.seconds:g}"}
        base = JobOptions(
            command=(str(REFERENCE),),
            launcher="python",
            job_id=self.job_id,
            python=opts.python,
            nproc_per_node=opts.nproc_per_node,
            master_port=0,
            env=env,
            timeout=opts.seconds + START_BUDGET,
            run_dir=opts.run_dir,
            preflight=False,
            grace=GRACE,
        )
        if opts.command:
            base = replace(base, command=tuple(opts.command), workdir=opts.workdir)
        else:
            threads = opts.threads
            if threads is None and self.cluster.is_local:  # local:N nodes share this machine
                threads = max(1, (os.cpu_count() or 1) // len(self.collector.ranks))
            args = ["--max-seconds", f"{opts.seconds + START_BUDGET:g}"]
            if threads is not None:
                args += ["--threads", str(threads)]
            if self.cluster.is_local:
                base = replace(base, command=(str(REFERENCE), *args))
            else:
                name = await ship_reference(transport, self.cluster.hosts)
                base = replace(base, command=(name, *args), workdir=REMOTE_DIR)
        return JobDescription(base, self.cluster, self.ssh)

    async def run(self) -> CalibrationRun:
        """Measure, save and return the calibration; JobFailed when a rank failed or
        never reported, the engine's CorralError when the job could not start."""
        transport = self._transport or transport_for(self.cluster, self.ssh)
        try:
            description = await self._description(transport)
            if self.interrupted:
                raise JobFailed("calibration interrupted before it started")
            job = ready_job(description, transport=transport)
            self.job = job
            self.collector.stop = job.stop
            job.subscribe(self.collector.on_event)
            for subscriber in self._subscribers:
                job.subscribe(subscriber)
            try:
                result = await job.run()
            finally:
                self.collector.cancel()
        finally:
            if self._transport is None:
                await transport.close()
        return self._finish(result, job.spec)

    def _finish(self, result: JobResult, spec: JobSpec) -> CalibrationRun:
        collector = self.collector
        if self.interrupted:
            raise JobFailed("calibration interrupted", exit_code=result.exit_code)
        if not collector.stopping and result.state == JobState.FAILED:
            raise _failure(result)
        if collector.silent():
            raise _silent_error(collector)
        if not collector.stopping and result.state != JobState.SUCCEEDED:
            raise _failure(result)
        calibration = build_calibration(
            collector.measured(),
            hosts=[h.name for h in self.cluster.hosts],
            job_id=self.job_id,
            seconds=self.options.seconds,
            script=list(self.options.command) or None,
            workload="script" if self.options.command else "reference",
        )
        early = collector.early_note()
        if early is not None:
            notes = f"{calibration.calibration_notes} {early}"
            calibration = calibration.model_copy(update={"calibration_notes": notes})
        run_dir = Path(os.path.abspath(spec.run_dir))
        path = save_calibration(calibration, run_dir / self.job_id / "calibration.json")
        latest = save_calibration(calibration, run_dir / LATEST)
        return CalibrationRun(calibration, path, latest)


async def calibrate(
    cluster: Cluster,
    options: CalibrateOptions | None = None,
    *,
    ssh: SshOptions | None = None,
    transport: Transport | None = None,
    subscribers: Sequence[Subscriber] = (),
) -> CalibrationRun:
    """Measure ``cluster`` once (see :class:`Calibrator`)."""
    calibrator = Calibrator(cluster, options, ssh=ssh, transport=transport)
    for subscriber in subscribers:
        calibrator.subscribe(subscriber)
    return await calibrator.run()


async def calibrate_then_weights(
    cluster: Cluster,
    options: CalibrateOptions | None = None,
    *,
    ssh: SshOptions | None = None,
    transport: Transport | None = None,
    subscribers: Sequence[Subscriber] = (),
) -> tuple[tuple[float, ...], CalibrationRun]:
    """``corral run --calibration auto``: calibrate first (by default the built-in
    reference workload for :data:`DEFAULT_SECONDS`; ``options.command`` measures a
    script instead), then the weights of the ranks the run plans."""
    run = await calibrate(cluster, options, ssh=ssh, transport=transport, subscribers=subscribers)
    nproc = (options or CalibrateOptions()).nproc_per_node
    return resolve_weights(run.calibration, cluster, nproc), run
