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
"""

from __future__ import annotations

import os

from corral.contract import CALIBRATE_ENV

__all__ = ["CALIBRATE_ENV", "calibrating"]


def calibrating() -> bool:
    """True when ``corral calibrate`` runs this script (``CORRAL_CALIBRATE=1``)."""
    return os.environ.get(CALIBRATE_ENV, "") == "1"
