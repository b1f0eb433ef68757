"""CLI verb registration: each module adds its commands to the root app."""

from __future__ import annotations

import importlib

import typer

# Each module exposes ``register(app)``. Modules not yet present are skipped only
# while the package is being assembled; the test of the public CLI pins the list.
_VERB_MODULES = (
    "run",
    "check",
    "exec",
    "sync",
    "logs",
    "ping",
    "serve",
    "job",
    "machine",
    "testbed",
    "calibrate",
    "k8s",
    "slurm",
)


def register_all(app: typer.Typer) -> None:
    """Add every verb module's commands to ``app``."""
    for name in _VERB_MODULES:
        module = importlib.import_module(f"corral.cli.{name}")
        module.register(app)
