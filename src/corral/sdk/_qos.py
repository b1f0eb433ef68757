"""macOS Quality-of-Service classes for training threads.

macOS ignores ``nice()`` for thread scheduling (Apple TN2169): the scheduler
(and which cores, performance or efficiency, run a thread) follows the
thread's QoS class, set with ``pthread_set_qos_class_self_np``. Elsewhere
there is nothing to set and these functions do nothing.
"""

from __future__ import annotations

import ctypes
import os
import platform
import sys
from collections.abc import Mapping

from corral.contract import QOS_CLASSES, QOS_ENV

__all__ = ["QOS_CLASSES", "QOS_ENV", "apply_qos_from_env", "set_qos"]

LIBSYSTEM = "/usr/lib/libSystem.B.dylib"


def _class(name: str) -> int:
    value = QOS_CLASSES.get(name)
    if value is None:
        raise ValueError(f"unknown QoS class {name!r}: use one of {', '.join(QOS_CLASSES)}")
    return value


def set_qos(qos_class: str) -> bool:
    """Set the calling thread's macOS QoS class (that thread only: threads made by
    ``pthread_create`` start at the default class, so call it in each thread that
    matters; corral's ``--qos`` sets the main thread). True when it was set;
    False on other systems (nothing is done) or when macOS refused (a warning is
    printed). An unknown class raises ValueError naming the valid ones."""
    value = _class(qos_class)
    if platform.system() != "Darwin":
        return False
    try:
        lib = ctypes.CDLL(LIBSYSTEM, use_errno=True)
        call = lib.pthread_set_qos_class_self_np
    except (OSError, AttributeError) as exc:
        _warn(f"cannot set QoS class {qos_class}: {exc}")
        return False
    call.argtypes = [ctypes.c_uint, ctypes.c_int]
    call.restype = ctypes.c_int
    result = call(value, 0)  # relative priority 0
    if result != 0:
        _warn(f"pthread_set_qos_class_self_np({qos_class}) failed: {os.strerror(result)}")
        return False
    return True


def apply_qos_from_env(env: Mapping[str, str] | None = None) -> bool:
    """Apply ``$CORRAL_QOS`` (``corral run --qos``) to the calling thread; False when
    unset or not on macOS. A bad value raises ValueError naming the variable."""
    raw = (os.environ if env is None else env).get(QOS_ENV, "").strip()
    if not raw:
        return False
    if raw not in QOS_CLASSES:
        raise ValueError(f"{QOS_ENV}={raw!r}: use one of {', '.join(QOS_CLASSES)}")
    return set_qos(raw)


def _warn(message: str) -> None:
    print(f"corral: warning: {message}", file=sys.stderr, flush=True)
