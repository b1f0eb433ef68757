"""The worker SDK: imported by training scripts on the nodes.

Works under corral, under plain ``torchrun`` and under plain ``python`` (one
process: rank 0, world size 1). Needs only the standard library; torch is
imported lazily by the functions that use it.

```python
from corral import sdk

sdk.init_distributed()                      # waits for the master, explicit timeouts
# the global batch of 1024 split over the ranks; lr tuned at a global batch of 256 -> 4e-3
cfg = sdk.scale_config(batch_size=1024, lr=1e-3, base_batch_size=256)
start = 0
if (ckpt := sdk.latest_checkpoint("ckpts")) is not None:
    start = sdk.load_checkpoint(ckpt)["step"]      # and restore model/optimizer
for step in range(start, total):
    ...
    sdk.report(step + 1, total, loss=loss.item())   # heartbeat to the supervisor
    if (step + 1) % 100 == 0:
        sdk.save_checkpoint({"step": step + 1, ...}, "ckpts", step + 1)  # rank 0, atomic
sdk.cleanup()
```
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from corral.lazy import lazy_exports

if TYPE_CHECKING:
    from corral.sdk._accelerate import get_accelerator
    from corral.sdk._calibrate import calibrating, calibration_batch
    from corral.sdk._checkpoint import (
        CheckpointWriteError,
        is_complete_checkpoint,
        latest_checkpoint,
        load_checkpoint,
        save_checkpoint,
    )
    from corral.sdk._chunks import Chunk, chunks
    from corral.sdk._config import job_config, output_dir, scale_config
    from corral.sdk._dist import (
        MasterNotReadyError,
        barrier,
        cleanup,
        destroy,
        init_distributed,
        wait_for_master,
    )
    from corral.sdk._env import (
        DistInfo,
        info,
        is_distributed,
        is_main_process,
        print_distributed_info,
        should_save_outputs,
    )
    from corral.sdk._errors import error_file_path, read_error_file, record, write_error_file
    from corral.sdk._ft import FaultTolerant, fault_tolerant
    from corral.sdk._ftstate import RNGState, StateMismatch
    from corral.sdk._krum import krum_hook
    from corral.sdk._memory import memory_split, micro_batch_fits, probe_fit
    from corral.sdk._preempt import checkpoint_requested, request_checkpoint
    from corral.sdk._qos import set_qos
    from corral.sdk._report import report
    from corral.sdk._resume import resume
    from corral.sdk._sampler import WeightedDistributedSampler
    from corral.sdk._section import section, straggler_hook
    from corral.sdk._stacks import enable_stack_dumps
    from corral.sdk._weights import local_batch_size, loss_scale, workload_weights

# Names are imported on first use (PEP 562): the rank wrapper and corral's own
# rank-side code import one or two SDK modules on every rank and must not pay
# for the rest (checkpoints, torchft, the sampler, ...).
_LAZY = {
    "CheckpointWriteError": "corral.sdk._checkpoint",
    "Chunk": "corral.sdk._chunks",
    "DistInfo": "corral.sdk._env",
    "FaultTolerant": "corral.sdk._ft",
    "MasterNotReadyError": "corral.sdk._dist",
    "RNGState": "corral.sdk._ftstate",
    "StateMismatch": "corral.sdk._ftstate",
    "WeightedDistributedSampler": "corral.sdk._sampler",
    "barrier": "corral.sdk._dist",
    "calibrating": "corral.sdk._calibrate",
    "calibration_batch": "corral.sdk._calibrate",
    "checkpoint_requested": "corral.sdk._preempt",
    "chunks": "corral.sdk._chunks",
    "cleanup": "corral.sdk._dist",
    "destroy": "corral.sdk._dist",
    "enable_stack_dumps": "corral.sdk._stacks",
    "error_file_path": "corral.sdk._errors",
    "fault_tolerant": "corral.sdk._ft",
    "get_accelerator": "corral.sdk._accelerate",
    "info": "corral.sdk._env",
    "init_distributed": "corral.sdk._dist",
    "is_complete_checkpoint": "corral.sdk._checkpoint",
    "is_distributed": "corral.sdk._env",
    "is_main_process": "corral.sdk._env",
    "job_config": "corral.sdk._config",
    "krum_hook": "corral.sdk._krum",
    "latest_checkpoint": "corral.sdk._checkpoint",
    "load_checkpoint": "corral.sdk._checkpoint",
    "local_batch_size": "corral.sdk._weights",
    "loss_scale": "corral.sdk._weights",
    "memory_split": "corral.sdk._memory",
    "micro_batch_fits": "corral.sdk._memory",
    "output_dir": "corral.sdk._config",
    "print_distributed_info": "corral.sdk._env",
    "probe_fit": "corral.sdk._memory",
    "read_error_file": "corral.sdk._errors",
    "record": "corral.sdk._errors",
    "report": "corral.sdk._report",
    "request_checkpoint": "corral.sdk._preempt",
    "resume": "corral.sdk._resume",
    "save_checkpoint": "corral.sdk._checkpoint",
    "scale_config": "corral.sdk._config",
    "section": "corral.sdk._section",
    "set_qos": "corral.sdk._qos",
    "should_save_outputs": "corral.sdk._env",
    "straggler_hook": "corral.sdk._section",
    "wait_for_master": "corral.sdk._dist",
    "workload_weights": "corral.sdk._weights",
    "write_error_file": "corral.sdk._errors",
}


if not TYPE_CHECKING:  # a type checker sees the names above, and no catch-all
    __getattr__ = lazy_exports(__name__, _LAZY, globals())

    def __dir__() -> list[str]:
        """The public names, loaded or not."""
        return sorted({*globals(), *__all__})


__all__ = [
    "CheckpointWriteError",
    "Chunk",
    "DistInfo",
    "FaultTolerant",
    "MasterNotReadyError",
    "RNGState",
    "StateMismatch",
    "WeightedDistributedSampler",
    "barrier",
    "calibrating",
    "calibration_batch",
    "checkpoint_requested",
    "chunks",
    "cleanup",
    "destroy",
    "enable_stack_dumps",
    "error_file_path",
    "fault_tolerant",
    "get_accelerator",
    "info",
    "init_distributed",
    "is_complete_checkpoint",
    "is_distributed",
    "is_main_process",
    "job_config",
    "krum_hook",
    "latest_checkpoint",
    "load_checkpoint",
    "local_batch_size",
    "loss_scale",
    "memory_split",
    "micro_batch_fits",
    "output_dir",
    "print_distributed_info",
    "probe_fit",
    "read_error_file",
    "record",
    "report",
    "request_checkpoint",
    "resume",
    "save_checkpoint",
    "scale_config",
    "section",
    "set_qos",
    "should_save_outputs",
    "straggler_hook",
    "wait_for_master",
    "workload_weights",
    "write_error_file",
]
