"""Defaults of a job's options that the layers below the engine apply too (the
pre-flight, host health), each written once.

A leaf (no import): the job description (:mod:`corral.job.describe`), the checks
(:mod:`corral.checks.context`) and host health (:mod:`corral.recovery.health`)
read them from here, so loading a description loads none of those layers.
"""

from __future__ import annotations

DEFAULT_MIN_FREE_GB = 1.0
"""``--min-free-gb``: free disk space the pre-flight asks of each host's workdir."""
DEFAULT_LINKS_MIN_RATIO = 0.3
"""``--links-min-ratio``: a link slower than this times the reference is slow."""
DEFAULT_HOST_TIMEOUT = 20.0
"""``--host-timeout``: seconds without any frame from a host's agent before it is lost."""

__all__ = ["DEFAULT_HOST_TIMEOUT", "DEFAULT_LINKS_MIN_RATIO", "DEFAULT_MIN_FREE_GB"]
