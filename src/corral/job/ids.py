"""A new job's id (standard library only: the CLI's entry point picks one before it loads)."""

from __future__ import annotations

import os
import time


def new_job_id() -> str:
    """A sortable, unique job id such as ``20261122-031502-7f3a``."""
    return time.strftime("%Y%m%d-%H%M%S") + "-" + os.urandom(2).hex()
