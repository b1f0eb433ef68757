"""Experiment tracking (``--track``): the coordinator forwards the ranks' reports, the
job's parameters and its final state to MLflow, TensorBoard or Weights & Biases.

:mod:`~corral.track.targets` parses and validates the targets (a missing extra is
an error before launch); :mod:`~corral.track.base` is the :class:`Tracker`
protocol, one module per backend implements it; :mod:`~corral.track.forward` calls
the trackers on a background thread. The job's events are turned into records by
:mod:`corral.job.tracking`. Nothing here imports the backends' packages until a
tracker is opened.
"""

from corral.track.base import FinalState, Point, RunInfo, Tracker
from corral.track.forward import Forwarder
from corral.track.targets import TrackPolicy, TrackTarget, parse_target, parse_targets

__all__ = [
    "FinalState",
    "Forwarder",
    "Point",
    "RunInfo",
    "TrackPolicy",
    "TrackTarget",
    "Tracker",
    "parse_target",
    "parse_targets",
]
