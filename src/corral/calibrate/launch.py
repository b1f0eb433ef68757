"""``--calibration auto``: a job's workload weights measured just before its launch.

:func:`weigh_now` measures the job's hosts with the built-in calibration (its
interpreter, ranks and env) and weighs the job's description with it
(:func:`corral.job.build.weigh`, as a calibration file weighs it); :func:`measure`
runs a :class:`~corral.calibrate.measure.Calibrator` with Ctrl-C / SIGTERM mapped
to its interrupt. The job's drift during the run is the builder's
(:func:`corral.job.build.ready_job`).
"""

from __future__ import annotations

from collections.abc import Callable

from corral.calibrate.measure import CalibrateOptions, CalibrationRun, Calibrator
from corral.errors import CorralError
from corral.job.build import Weighing, weigh
from corral.job.describe import JobDescription
from corral.signals import stop_on_signals

AUTO = "auto"
"""``--calibration auto``: measure with the built-in workload just before the launch."""

__all__ = ["AUTO", "measure", "weigh_now"]


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


async def weigh_now(
    description: JobDescription,
    *,
    seconds: float,
    watch: Callable[[Calibrator], None] | None = None,
) -> Weighing | None:
    """``description`` weighed by the built-in calibration, measured now on its hosts
    with its interpreter, ranks and env (``watch`` sees the calibrator first, to
    subscribe to its job's events); None when Ctrl-C interrupted it."""
    options = description.options
    calibrate = CalibrateOptions(
        seconds=seconds,
        nproc_per_node=options.nproc_per_node,
        python=options.python,
        env=dict(options.env),
        run_dir=options.run_dir,
    )
    calibrator = Calibrator(description.cluster, calibrate, ssh=description.ssh)
    if watch is not None:
        watch(calibrator)
    run = await measure(calibrator)
    return None if run is None else weigh(description, run.calibration)
