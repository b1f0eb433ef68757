"""Per-rank throughput measurement and workload weights (``corral calibrate``).

- :mod:`~corral.calibration.model`: the calibration file (seed 000's shape);
- :mod:`~corral.calibration.weights`: rates from reports, shares, notes (pure);
- :mod:`~corral.calibration.resolve`: a file's figures onto a run's ranks (pure);
- :mod:`~corral.calibration.measure`: the measurement, a job on every host at once;
- :mod:`~corral.calibration.drift`: live throughput against the calibration, and
  rebalanced weights for the next attempt;
- :mod:`~corral.calibration.reference`: the built-in workload (runs on the hosts;
  imports torch, so nothing here imports it).

Import the submodules; this package imports nothing.
"""
