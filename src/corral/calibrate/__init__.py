"""Per-rank throughput measurement and workload weights (``corral calibrate``).

- :mod:`~corral.calibrate.model`: the calibration file (seed 000's shape);
- :mod:`~corral.calibrate.weights`: rates from reports, shares, notes (pure);
- :mod:`~corral.calibrate.resolve`: a file's figures onto a run's ranks (pure);
- :mod:`~corral.calibrate.measure`: the measurement, a job on every host at once;
- :mod:`~corral.calibrate.drift`: live throughput against the calibration, and
  rebalanced weights for the next attempt;
- :mod:`~corral.calibrate.reference`: the built-in workload (runs on the hosts;
  imports torch, so nothing here imports it).

Import the submodules; this package imports nothing.
"""
