"""Where a relative checkpoint path of the SDK points: the job's working directory.

On SSH hosts the ranks run in the job's working directory (``--workdir``, else
the directory ``corral run`` was started in), so a relative path means the same
on every run. On ``local:N`` each node's ranks run in the node's own directory
(``runs/<job>/nodes/<host>/work``, new for every job), so corral sets
``CORRAL_LAUNCH_DIR`` to that working directory and the SDK's checkpoint
functions (``save_checkpoint``, ``latest_checkpoint``, ``load_checkpoint``,
``resume``, ``chunks``) resolve a relative path against it: ``ckpt`` is
``<where you ran corral>/ckpt`` on every run of the job, as a relative
``--checkpoint-dir`` is. Without the variable (plain ``python`` or
``torchrun``, SSH hosts) a relative path is the process's own, as usual.
"""

from __future__ import annotations

import os
from pathlib import Path

from corral.contract import LAUNCH_DIR_ENV

__all__ = ["LAUNCH_DIR_ENV", "job_path"]


def job_path(path: str | os.PathLike[str]) -> Path:
    """``path`` with ``~`` expanded; relative: under ``$CORRAL_LAUNCH_DIR`` when set."""
    resolved = Path(path).expanduser()
    base = os.environ.get(LAUNCH_DIR_ENV, "").strip()
    if resolved.is_absolute() or not base or not os.path.isabs(base):
        return resolved
    return Path(base) / resolved
