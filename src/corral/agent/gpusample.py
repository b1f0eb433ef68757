"""The node agent's GPU samples: each rank's GPU utilisation, memory and
temperature, read through NVML (:mod:`corral.agent.gpuprobe`) every
:data:`INTERVAL` seconds and attached to the rank's next progress report.

A host without NVIDIA devices, or without ``pynvml`` (the ``[gpu]`` extra), has
no sampler: :meth:`GpuSampler.open` answers None at the cost of one ``glob``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from corral.agent.gpuprobe import Nvml, close_nvml, nvidia_devices, open_nvml, sample

__all__ = ["INTERVAL", "GpuSampler", "assign", "nvidia_devices"]

INTERVAL = 5.0


def _visible(env_value: str | None) -> list[int] | None:
    """``CUDA_VISIBLE_DEVICES`` as NVML indices (None: unset, or UUIDs: not mapped)."""
    if env_value is None:
        return None
    try:
        return [int(v) for v in env_value.split(",") if v.strip()]
    except ValueError:
        return None


def assign(
    gpus: list[dict[str, Any]],
    ranks: Mapping[int, tuple[int | None, int]],
    visible: str | None = None,
) -> dict[int, dict[str, Any]]:
    """Each rank's GPU sample: the GPU whose compute processes include the rank's
    PID, else its local rank's GPU (through ``CUDA_VISIBLE_DEVICES`` when set).
    ``ranks``: rank -> (PID, local rank)."""
    by_pid = {pid: g for g in gpus for pid in g.get("pids") or []}
    by_index = {g["index"]: g for g in gpus}
    order = _visible(visible)
    out: dict[int, dict[str, Any]] = {}
    for rank, (pid, local_rank) in ranks.items():
        g = by_pid.get(pid) if pid is not None else None
        if g is None:
            index = order[local_rank] if order and local_rank < len(order) else local_rank
            g = by_index.get(index)
        if g is not None:
            out[rank] = {
                k: g[k] for k in ("index", "util", "mem_used_mib", "mem_total_mib", "temp_c")
            }
    return out


class GpuSampler:
    """NVML, opened once for the agent's life (close it at the end)."""

    def __init__(self, nvml: Nvml) -> None:
        self.nvml = nvml

    @classmethod
    def open(cls) -> GpuSampler | None:
        """A sampler, or None on a host without NVIDIA devices or NVML."""
        if not nvidia_devices():
            return None
        nvml, _, _ = open_nvml()
        return cls(nvml) if nvml is not None else None

    def take(
        self, ranks: Mapping[int, tuple[int | None, int]], visible: str | None = None
    ) -> dict[int, dict[str, Any]]:
        """Every live rank's sample now (:func:`assign`); {} when NVML fails."""
        try:
            return assign(sample(self.nvml), ranks, visible)
        except Exception:  # a GPU lost mid-run: the health of the job is not ours to end
            return {}

    def close(self) -> None:
        """Shut NVML down."""
        close_nvml(self.nvml)
