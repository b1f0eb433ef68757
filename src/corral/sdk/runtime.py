"""What corral's own rank-side code uses of the SDK beyond the user API.

The rank wrapper (:mod:`corral.agent.worker`), the plugin harness and the actor
workers run inside the ranks, as a training script does, and need a few SDK
internals that :mod:`corral.sdk` does not offer to scripts. They import them from
here, never from the SDK's private modules. The names the ranks and corral agree
on (variables, file names) are in :mod:`corral.contract`.
"""

from __future__ import annotations

from corral.sdk._accelerate import set_accelerator
from corral.sdk._dist import collect_garbage_at_exit
from corral.sdk._qos import apply_qos_from_env
from corral.sdk._report import connect_control

__all__ = [
    "apply_qos_from_env",
    "collect_garbage_at_exit",
    "connect_control",
    "set_accelerator",
]
