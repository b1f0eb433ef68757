"""Rank-time Accelerate setup (``--launcher accelerate`` and the harness).

corral starts every rank itself with torchrun's variables (``RANK``,
``WORLD_SIZE``, ``LOCAL_RANK``, ``MASTER_ADDR``, ``MASTER_PORT``), which is all
Accelerate reads. Two things are left, done here before the script runs:

* on a host without a GPU Accelerate only forms a (gloo) group when
  ``ACCELERATE_USE_CPU`` is set; without it every process trains alone and the
  job "passes". It is set here unless the user set it (``--env``);
* whatever the cause, a world size seen by Accelerate other than the plan's is
  refused: the first ``PartialState`` (made by ``Accelerator()``) that sees one
  raises :class:`WorldSizeMismatch`, naming the host and rank.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, MutableMapping
from typing import Any

from corral.contract import HOST_ENV

USE_CPU = "ACCELERATE_USE_CPU"


class SetupError(RuntimeError):
    """The rank cannot run as asked; its message is the whole story (no traceback)."""


class WorldSizeMismatch(SetupError):
    """Accelerate sees a world other than the plan's: the job would pass falsely."""


def has_gpu() -> bool:
    """Whether torch sees a CUDA (or XPU) device Accelerate would use."""
    import torch

    if torch.cuda.is_available():
        return True
    xpu = getattr(torch, "xpu", None)
    return bool(xpu is not None and xpu.is_available())


def _cpu_threads(env: MutableMapping[str, str]) -> None:
    """What Accelerate does on a CPU rank when ``OMP_NUM_THREADS`` is unset (the
    physical cores shared by the node's ranks), without its warning on every rank."""
    if env.get("OMP_NUM_THREADS"):
        return
    import psutil
    import torch

    cores = psutil.cpu_count(logical=False) or os.cpu_count() or 1
    threads = max(1, cores // max(1, int(env.get("LOCAL_WORLD_SIZE") or "1")))
    env["OMP_NUM_THREADS"] = str(threads)
    torch.set_num_threads(threads)


def mismatch_message(
    seen: int, expected: int, where: str, detail: str, env: Mapping[str, str]
) -> str:
    """Why a rank is refused: what Accelerate saw, what the plan says, the likely cause."""
    plural = "process" if seen == 1 else "processes"
    text = (
        f"Accelerate sees a world of {seen} {plural} on {where}, but the job has "
        f"{expected} ranks ({detail}): the ranks would not train together and the job "
        "would pass without being distributed; refused."
    )
    flag = env.get(USE_CPU)
    if seen == 1 and flag is not None and flag.strip().lower() not in ("1", "true", "yes", "y"):
        text += (
            f" {USE_CPU}={flag} was given (--env): on a host without a GPU Accelerate "
            f"needs {USE_CPU}=1 to form a CPU group; corral sets it when the env leaves it out."
        )
    return text


def install_guard(expected: int, where: str, env: MutableMapping[str, str]) -> None:
    """Refuse, at the script's first ``Accelerator()``/``PartialState()``, a world size
    other than ``expected`` (raises :class:`WorldSizeMismatch` there)."""
    from accelerate.state import PartialState

    original = PartialState.__init__
    if getattr(original, "_corral_guard", False):
        return

    def init(self: Any, *args: Any, **kwargs: Any) -> None:
        original(self, *args, **kwargs)
        seen = int(self.num_processes)
        if seen != expected:
            detail = f"distributed type {self.distributed_type.value}"
            raise WorldSizeMismatch(mismatch_message(seen, expected, where, detail, env))

    init._corral_guard = True  # type: ignore[attr-defined]
    PartialState.__init__ = init


def prepare(env: MutableMapping[str, str] | None = None) -> None:
    """Before the script: ``ACCELERATE_USE_CPU=1`` on a host without a GPU (unless the
    env sets it) and the world-size guard. A :class:`SetupError` when Accelerate is
    missing."""
    env = os.environ if env is None else env
    expected = int(env.get("WORLD_SIZE") or "1")
    where = f"host {env.get(HOST_ENV) or os.uname().nodename} (rank {env.get('RANK', '0')})"
    try:
        if USE_CPU not in env and not has_gpu():
            env[USE_CPU] = "1"
            _cpu_threads(env)
        install_guard(expected, where, env)
    except ImportError as exc:
        import sys

        raise SetupError(
            f"{exc.name or exc} is not installed for {sys.executable} on {where}: "
            f"{sys.executable} -m pip install accelerate (the accelerate launcher and "
            "the harness need it)"
        ) from exc
