"""Per-rank throughput measurement (``corral calibrate``).

- :mod:`~corral.calibrate.measure`: the measurement, a job on every host at once,
  built like every job (:func:`corral.job.build.ready_job`);
- :mod:`~corral.calibrate.launch`: ``--calibration auto``, measured just before a launch;
- :mod:`~corral.calibrate.reference`: the built-in workload (runs on the hosts;
  imports torch, so nothing here imports it).

The calibration file, the rates and the weights made of them are values below the
engine (:mod:`corral.throughput`); a running job's drift against them is the
engine's (:mod:`corral.job.drift`). Import the submodules; this package imports nothing.
"""
