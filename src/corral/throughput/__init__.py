"""Per-rank throughput figures and the workload weights made of them (pure values,
below the engine, so the job builder weighs a job without the measurement).

- :mod:`~corral.throughput.model`: the calibration file (seed 000's shape);
- :mod:`~corral.throughput.weights`: rates from reports, shares, notes;
- :mod:`~corral.throughput.resolve`: a file's figures onto a run's ranks.

They are measured by :mod:`corral.calibrate` (a job on every host) and watched live
by :mod:`corral.job.drift`. Import the submodules; this package imports nothing.
"""
