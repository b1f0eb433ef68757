"""``sdk.get_accelerator``: the job's HF Accelerate ``Accelerator``."""

from __future__ import annotations

import sys
from typing import Any

__all__ = ["get_accelerator"]

_accelerator: Any = None


def set_accelerator(accelerator: Any) -> None:
    """Make ``accelerator`` the one :func:`get_accelerator` returns (the harness's)."""
    global _accelerator
    _accelerator = accelerator


def get_accelerator() -> Any:
    """The job's ``accelerate.Accelerator``: the plugin harness's under
    ``corral run --harness`` (also ``sys.modules['__main__'].accelerator``), else one
    made on the first call and returned by every later one."""
    global _accelerator
    if _accelerator is None:
        from accelerate import Accelerator

        given = getattr(sys.modules.get("__main__"), "accelerator", None)
        _accelerator = given if isinstance(given, Accelerator) else Accelerator()
    return _accelerator
