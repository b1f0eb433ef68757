"""``sdk.calibrating()``: whether this run is a ``corral calibrate`` measurement.

``corral calibrate -- SCRIPT`` runs the script on every rank with
``CORRAL_CALIBRATE=1`` and stops it after ``--seconds``. A script measures its
real training step then: it reports what each step processed with
``sdk.report(step, examples=n)`` and should leave out what makes ranks wait for
each other (the process group, DDP's gradient all-reduce), so each rank runs at
its own speed::

    if sdk.calibrating():
        model = make_model()          # no DDP wrapper, no init_distributed()
    else:
        sdk.init_distributed()
        model = DistributedDataParallel(make_model())
    for step, (x, y) in enumerate(batches, 1):
        ...
        sdk.report(step, examples=len(x))

A step also costs a fixed time whatever its batch (the optimizer step, Python,
data loading's per-batch work). To measure it, run steps of two batch sizes
under calibration: ``sdk.calibration_batch(step, batch)`` is ``batch`` on even
steps and a quarter of it on odd ones (unchanged outside calibration), and with
one report per step corral fits ``t(b) = f + b / r`` per rank; the split then
makes ``f_i + b_i / r_i`` equal across ranks rather than ``b_i`` proportional to
``r_i``::

    for step, (x, y) in enumerate(batches, 1):
        n = sdk.calibration_batch(step, len(x))
        x, y = x[:n], y[:n]
        ...
        sdk.report(step, examples=n)
"""

from __future__ import annotations

import os

from corral.contract import CALIBRATE_ENV

__all__ = ["CALIBRATE_ENV", "SMALL_FRACTION", "calibrating", "calibration_batch"]


def calibrating() -> bool:
    """True when ``corral calibrate`` runs this script (``CORRAL_CALIBRATE=1``)."""
    return os.environ.get(CALIBRATE_ENV, "") == "1"


#: Under calibration every other step runs this fraction of the batch.
SMALL_FRACTION = 0.25


def calibration_batch(step: int, batch: int, every: int = 1) -> int:
    """The batch to run at ``step``: ``batch`` outside calibration; under it, ``batch``
    and a quarter of it (at least 1) in turns of ``every`` steps (the steps one report
    covers), so corral separates the step's fixed cost from its per-example cost."""
    if batch < 1 or every < 1:
        raise ValueError(f"batch and every must be at least 1 (got {batch}, {every})")
    if not calibrating() or (step // every) % 2 == 0:
        return batch
    return max(1, int(batch * SMALL_FRACTION))
