"""What corral's own rank-side code uses of the SDK beyond the user API.

The rank wrapper (:mod:`corral.agent.worker`), the plugin harness and the actor
workers run inside the ranks, as a training script does, and need a few SDK
internals that :mod:`corral.sdk` does not offer to scripts. They import them from
here, never from the SDK's private modules. The names the ranks and corral agree
on (variables, file names) are in :mod:`corral.contract`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from corral.lazy import lazy_exports

if TYPE_CHECKING:
    from corral.sdk._accelerate import set_accelerator
    from corral.sdk._dist import collect_garbage_at_exit
    from corral.sdk._ftlog import quiet_torchft
    from corral.sdk._qos import apply_qos_from_env
    from corral.sdk._report import connect_control, flush_reports

# Imported on first use (PEP 562): the rank wrapper needs connect_control and
# flush_reports on every rank, the rest only with the options that use them.
_LAZY = {
    "apply_qos_from_env": "corral.sdk._qos",
    "collect_garbage_at_exit": "corral.sdk._dist",
    "connect_control": "corral.sdk._report",
    "flush_reports": "corral.sdk._report",
    "quiet_torchft": "corral.sdk._ftlog",
    "set_accelerator": "corral.sdk._accelerate",
}


if not TYPE_CHECKING:  # a type checker sees the names above, and no catch-all
    __getattr__ = lazy_exports(__name__, _LAZY, globals())


__all__ = [
    "apply_qos_from_env",
    "collect_garbage_at_exit",
    "connect_control",
    "flush_reports",
    "quiet_torchft",
    "set_accelerator",
]
