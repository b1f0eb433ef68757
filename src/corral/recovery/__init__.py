"""Recovering from failures: restart policy, host health, hang detection, checkpoints."""
