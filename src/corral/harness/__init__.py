"""The plugin harness (``corral run --harness``) and the Accelerate rank setup.

Plan time, on this machine (:mod:`corral.harness.config`): which file the plugin's
``--config_file`` names, read once so each attempt's plan can adjust it to the
attempt's world size. Rank time, in each rank's wrapper
(:mod:`corral.harness.accelerate`, :mod:`corral.harness.plugin`): Accelerate's env,
the refusal of a world size other than the plan's, the accelerator given to the
plugin, the plugin's per-rank config written to the node dir.
"""
