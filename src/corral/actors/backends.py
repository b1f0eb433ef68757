"""Training backends for actor workers: DDP and FSDP2 over one process group.

A worker builds its model, hands it to a backend and then obeys the
coordinator's ``forward_backward`` / ``optim_step`` / ``save_checkpoint``
messages (the seed's MiniRay loop)::

    backend = FSDPTrainingBackend(
        model,
        lambda params: torch.optim.AdamW(params, lr=3e-3),  # built after sharding
        torch.nn.functional.mse_loss,
        checkpoint_dir="ckpts",                 # may be local to each host
        config=FSDPConfig(sharding_strategy="FULL_SHARD", mixed_precision="bf16"),
    )
    start = backend.load_checkpoint() or 0
    metrics = backend.forward_backward({"inputs": x, "labels": y})  # loss, grad_norm, examples
    backend.optim_step()                                            # lr, step
    backend.save_checkpoint(step)
    backend.shutdown()

The process group is the caller's when one is up (the actors runtime sets
``RANK``/``WORLD_SIZE``/``MASTER_*``); otherwise the backend initialises it from
the environment (``env://``, gloo on CPU, nccl on CUDA, explicit timeout) and
destroys it on :meth:`TrainingBackend.shutdown`. On CUDA the device is
``cuda:LOCAL_RANK``.

Mixed precision ``"bf16"`` computes in bfloat16 (FSDP2: params all-gathered in
bf16, gradients reduced in fp32; DDP: autocast) where every rank's device has
native bf16; otherwise it logs once why and runs fp32.

Checkpoints use ``torch.distributed.checkpoint`` on the sharded state dict
(``get_state_dict``/``set_state_dict``). Two layouts (``checkpoint_layout``):

- ``"per_rank"`` (default): each rank writes its own shards, with their own
  metadata, to ``<checkpoint_dir>/step_<n>/rank_<r>/`` and reads only those back.
  Works when each host's ``checkpoint_dir`` is local to it (and on shared
  storage). Constraint: resume with the same world size, rank placement and
  sharding strategy; a different world size is refused with :class:`ConfigError`.
- ``"global"``: one DCP checkpoint written by all ranks together to
  ``<checkpoint_dir>/step_<n>/``. Needs a directory every rank shares; in
  return it loads at any world size or sharding strategy (DCP reshards).
"""

from __future__ import annotations

import contextlib
import gc
import json
import logging
import math
import os
import shutil
import warnings
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any, ClassVar, Literal

import torch
import torch.distributed as dist
from torch import nn

from corral.contract import DIST_TIMEOUT_ENV
from corral.errors import ConfigError
from corral.sdk import info, init_distributed
from corral.sdk.runtime import collect_garbage_at_exit

__all__ = [
    "BackendConfig",
    "DDPConfig",
    "DDPTrainingBackend",
    "FSDPConfig",
    "FSDPTrainingBackend",
    "TrainingBackend",
]

log = logging.getLogger(__name__)

ShardingStrategy = Literal["FULL_SHARD", "SHARD_GRAD_OP", "NO_SHARD"]
CheckpointLayout = Literal["per_rank", "global"]
LRSchedule = Literal["constant", "linear", "cosine"]
#: ``lambda params: torch.optim.AdamW(params, lr=...)``: called with the (sharded) parameters.
OptimizerFactory = Callable[[Iterable[nn.Parameter]], torch.optim.Optimizer]
SchedulerFactory = Callable[[torch.optim.Optimizer], Any]
LossFn = Callable[..., torch.Tensor]

_INPUT_KEYS = ("input_ids", "inputs", "x")
_LABEL_KEYS = ("labels", "targets", "y")
_LOSS_KWARGS = ("loss_mask", "advantages")
_META = "meta.json"
_said: set[str] = set()


@dataclass(frozen=True)
class BackendConfig:
    """Settings shared by both backends (validated on creation, :class:`ConfigError`)."""

    max_grad_norm: float | None = 1.0
    """Clip the global gradient norm to this before each step; None: no clipping."""
    mixed_precision: str | bool | None = None
    """``"bf16"`` (or True) to compute in bfloat16 where supported; None/False/``"fp32"``: off."""
    lr_schedule: LRSchedule = "constant"
    """After ``warmup_steps``: constant, or linear/cosine decay to ``min_lr_ratio`` x lr."""
    warmup_steps: int = 0
    total_steps: int | None = None
    min_lr_ratio: float = 0.0
    device: str | None = None
    """``"cpu"``, ``"cuda"`` (``cuda:LOCAL_RANK``) or ``"cuda:N"``; None: CUDA if usable."""
    timeout: float | None = None
    """Seconds for process-group setup and collectives when the backend creates the group;
    None: the job's ``collective_timeout`` (``CORRAL_DIST_TIMEOUT``), else 300."""
    checkpoint_layout: CheckpointLayout = "per_rank"
    sync_module_states: bool = True
    """Broadcast rank 0's parameters and buffers before wrapping, so every rank starts equal."""

    def __post_init__(self) -> None:
        _precision(self.mixed_precision)
        checks: list[tuple[str, bool, str]] = [
            ("max_grad_norm", self.max_grad_norm is None or self.max_grad_norm > 0, "> 0 or None"),
            ("lr_schedule", self.lr_schedule in ("constant", "linear", "cosine"),
             "constant, linear or cosine"),
            ("warmup_steps", self.warmup_steps >= 0, ">= 0"),
            ("total_steps", self.total_steps is not None or self.lr_schedule == "constant",
             f"required with lr_schedule={self.lr_schedule!r}"),
            ("total_steps", self.total_steps is None or self.total_steps > self.warmup_steps,
             "> warmup_steps"),
            ("min_lr_ratio", 0.0 <= self.min_lr_ratio <= 1.0, "between 0 and 1"),
            ("timeout", self.timeout is None or self.timeout > 0, "> 0 seconds"),
            ("checkpoint_layout", self.checkpoint_layout in ("per_rank", "global"),
             "per_rank or global"),
        ]  # fmt: skip
        for option, ok, want in checks:
            if not ok:
                raise ConfigError(f"must be {want}, got {getattr(self, option)!r}", option=option)


@dataclass(frozen=True)
class DDPConfig(BackendConfig):
    """:class:`BackendConfig` plus DistributedDataParallel's own switch."""

    find_unused_parameters: bool = False


@dataclass(frozen=True)
class FSDPConfig(BackendConfig):
    """:class:`BackendConfig` plus how FSDP2 (``fully_shard``) splits the model.

    ``FULL_SHARD`` reshards parameters after forward (least memory),
    ``SHARD_GRAD_OP`` keeps them gathered until backward ends, ``NO_SHARD``
    replicates them (a replicate x 1 mesh: DDP-like, through FSDP2). Each
    submodule whose class (or class name) is in ``shard_modules`` becomes its
    own unit; by default every direct child with parameters does (looking into
    ``ModuleList``/``ModuleDict``), then the root.
    """

    sharding_strategy: ShardingStrategy = "FULL_SHARD"
    shard_modules: tuple[type[nn.Module] | str, ...] = ()

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.sharding_strategy not in ("FULL_SHARD", "SHARD_GRAD_OP", "NO_SHARD"):
            raise ConfigError(
                f"must be FULL_SHARD, SHARD_GRAD_OP or NO_SHARD, got {self.sharding_strategy!r}",
                option="sharding_strategy",
            )


def _precision(value: str | bool | None) -> Literal["bf16", "fp32"]:
    if value is True or (isinstance(value, str) and value.lower() in ("bf16", "bfloat16")):
        return "bf16"
    if value in (None, False) or (isinstance(value, str) and value.lower() in ("fp32", "no")):
        return "fp32"
    raise ConfigError(
        f"must be 'bf16', True, None or 'fp32', not {value!r}", option="mixed_precision"
    )


def _say_once(message: str) -> None:
    if message not in _said:
        _said.add(message)
        log.warning(message)


def _bf16_support(device: torch.device) -> tuple[bool, str]:
    """Whether ``device`` computes bf16 natively, and why not."""
    if device.type == "cuda":
        return bool(torch.cuda.is_bf16_supported()), f"{device} has no bf16 support"
    if device.type == "cpu":
        try:
            native = bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
        except (AttributeError, RuntimeError):
            native = False
        return native, "this CPU has no native bf16 (AVX512-BF16/AMX): bf16 would be emulated"
    return False, f"bf16 is not known to work on {device.type}"


def _group_timeout(config: BackendConfig) -> float:
    """The process group's timeout: the config's, else the job's, else 300 s."""
    if config.timeout is not None:
        return config.timeout
    with contextlib.suppress(ValueError):
        if (seconds := float(os.environ.get(DIST_TIMEOUT_ENV, ""))) > 0:
            return seconds
    return 300.0


def _ensure_process_group(config: BackendConfig) -> bool:
    """Initialise the default group from the environment unless one is up; True if we did."""
    if dist.is_initialized():
        return False
    want_cuda = torch.cuda.is_available() and (config.device or "cuda").startswith("cuda")
    backend = "nccl" if want_cuda else "gloo"
    from torch._C._distributed_c10d import HashStore

    if info().world_size > 1:
        init_distributed(backend=backend, timeout=config.timeout)
    else:  # one process: an in-memory store, no port
        dist.init_process_group(
            backend, store=HashStore(), rank=0, world_size=1,
            timeout=timedelta(seconds=_group_timeout(config)),
        )  # fmt: skip
    return True


def _pick_device(config: BackendConfig) -> torch.device:
    local_rank = info().local_rank
    if config.device is not None:
        device = torch.device(config.device)
    elif torch.cuda.is_available() and "nccl" in str(dist.get_backend()):
        device = torch.device("cuda")
    else:
        device = torch.device("cpu")
    if device.type == "cuda":
        if device.index is None:
            device = torch.device("cuda", local_rank % max(1, torch.cuda.device_count()))
        torch.cuda.set_device(device)
    return device


def _lr_lambda(config: BackendConfig) -> Callable[[int], float]:
    warmup, total, floor = config.warmup_steps, config.total_steps, config.min_lr_ratio

    def factor(step: int) -> float:
        if step < warmup:
            return (step + 1) / (warmup + 1)
        if config.lr_schedule == "constant" or total is None:
            return 1.0
        done = min(1.0, (step - warmup) / max(1, total - warmup))
        cosine = 0.5 * (1 + math.cos(math.pi * done))
        shape = 1.0 - done if config.lr_schedule == "linear" else cosine
        return floor + (1.0 - floor) * shape

    return factor


def _bind_optimizer(
    optimizer: torch.optim.Optimizer | OptimizerFactory,
    names: Mapping[int, str],
    module: nn.Module,
) -> torch.optim.Optimizer:
    """The optimizer over ``module``'s current parameters.

    A factory is called with them. An optimizer built before wrapping (the
    seed's style) is re-pointed at the wrapped parameters by name; it must not
    have taken a step yet, since FSDP2 replaced the tensors its state belongs to.
    """
    if not isinstance(optimizer, torch.optim.Optimizer):
        return optimizer(module.parameters())
    if optimizer.state:
        raise ConfigError(
            "the optimizer already has state; pass a factory (lambda params: ...) instead",
            option="optimizer",
        )
    current = dict(module.named_parameters())
    for group in optimizer.param_groups:
        try:
            group["params"] = [current[names[id(p)]] for p in group["params"]]
        except KeyError as exc:
            raise ConfigError(
                f"the optimizer holds a parameter that is not the model's ({exc})",
                option="optimizer",
            ) from None
    return optimizer


def _to_device(value: Any, device: torch.device) -> torch.Tensor:
    tensor = value if isinstance(value, torch.Tensor) else torch.as_tensor(value)
    return tensor.to(device, non_blocking=True)


def _split_batch(
    batch: Any, device: torch.device
) -> tuple[torch.Tensor, torch.Tensor, dict[str, torch.Tensor]]:
    """``(inputs, labels, loss kwargs)`` on ``device`` from a mapping or a pair."""
    if isinstance(batch, Mapping):
        inputs = next((batch[k] for k in _INPUT_KEYS if k in batch), None)
        labels = next((batch[k] for k in _LABEL_KEYS if k in batch), None)
        if inputs is None or labels is None:
            raise ValueError(
                f"a batch needs one of {_INPUT_KEYS} and one of {_LABEL_KEYS}; got {sorted(batch)}"
            )
        extra = {k: _to_device(batch[k], device) for k in _LOSS_KWARGS if k in batch}
    elif isinstance(batch, (tuple, list)) and len(batch) == 2:
        (inputs, labels), extra = batch, {}
    else:
        raise TypeError("a batch is a mapping (input_ids/inputs, labels, ...) or (inputs, labels)")
    return _to_device(inputs, device), _to_device(labels, device), extra


def _full(tensor: torch.Tensor) -> torch.Tensor:
    full = getattr(tensor, "full_tensor", None)  # a DTensor: reduce or gather its shards
    return full() if callable(full) else tensor


@contextlib.contextmanager
def _rank_local() -> Iterator[None]:
    """DCP without collectives (``no_dist``), minus its warning that this is on purpose."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="torch.distributed is disabled")
        yield


def _read_meta(path: Path) -> dict[str, Any] | None:
    try:
        meta = json.loads((path / _META).read_text())
    except (OSError, ValueError):
        return None
    return meta if isinstance(meta, dict) else None


def _choose_step(
    views: list[dict[int, int]], world_size: int, layout: CheckpointLayout, wanted: int | None
) -> int | None:
    """The checkpoint step every rank can load, from each rank's ``{step: saved world size}``."""
    steps = sorted({s for view in views for s in view}, reverse=True)
    if wanted is not None:
        steps = [wanted]
    for step in steps:
        missing = [r for r, view in enumerate(views) if step not in view]
        saved = {view[step] for view in views if step in view}
        if layout == "per_rank" and saved - {world_size}:
            raise ConfigError(
                f"checkpoint step {step} was saved by {sorted(saved)} ranks, this job has "
                f"{world_size}: per_rank checkpoints resume only at the same world size "
                "(save with checkpoint_layout='global' to a shared directory to change it)",
                option="checkpoint_dir",
            )
        if not missing:
            return step
        if layout == "global" and len(missing) < len(views):
            raise ConfigError(
                f"checkpoint step {step} is not visible on rank(s) {missing}: the global layout "
                "needs a checkpoint_dir shared by all ranks (use 'per_rank' for host-local dirs)",
                option="checkpoint_dir",
            )
        if wanted is not None:
            raise ConfigError(
                f"checkpoint step {step} is missing on rank(s) {missing}", option="checkpoint_dir"
            )
        _say_once(f"checkpoint step {step} is incomplete (missing on ranks {missing}); skipped")
    return None


class TrainingBackend(ABC):
    """What both backends share: the step loop, clipping, schedule, checkpoints.

    ``optimizer`` is an optimizer factory (called with the wrapped parameters)
    or an optimizer built on the unwrapped model that has not stepped yet.
    ``loss_fn(outputs, labels, **loss_kwargs)`` returns a scalar; a batch's
    ``loss_mask``/``advantages`` entries are passed through as keyword arguments.
    Every method but :meth:`state` is collective: call it on every rank.
    """

    kind: ClassVar[str] = "base"
    config_type: ClassVar[type[BackendConfig]] = BackendConfig
    config: BackendConfig

    def __init__(
        self,
        model: nn.Module,
        optimizer: torch.optim.Optimizer | OptimizerFactory,
        loss_fn: LossFn,
        checkpoint_dir: str | os.PathLike[str],
        config: BackendConfig | None = None,
        scheduler_factory: SchedulerFactory | None = None,
    ) -> None:
        config = self.config_type() if config is None else config
        if not isinstance(config, self.config_type):
            raise ConfigError(
                f"{type(self).__name__} takes a {self.config_type.__name__}, "
                f"not a {type(config).__name__}",
                option="config",
            )
        self.config = config
        self.loss_fn = loss_fn
        self.checkpoint_dir = Path(checkpoint_dir)
        self._owns_group = _ensure_process_group(config)
        collect_garbage_at_exit()
        self.rank = dist.get_rank()
        self.world_size = dist.get_world_size()
        self.device = _pick_device(config)
        self.precision = self._agree_precision(_precision(config.mixed_precision))
        model = model.to(self.device)
        if config.sync_module_states and self.world_size > 1:
            for tensor in [*model.parameters(), *model.buffers()]:
                dist.broadcast(tensor.data, src=0)
        names = {id(p): n for n, p in model.named_parameters()}
        self.module = model  # the unwrapped module (FSDP2 wraps in place)
        self.model = self._wrap(model)
        self.optimizer = _bind_optimizer(optimizer, names, self.module)
        factory = scheduler_factory or (
            lambda opt: torch.optim.lr_scheduler.LambdaLR(opt, _lr_lambda(config))
        )
        self.scheduler = factory(self.optimizer)
        self.step = 0
        self.last_checkpoint: int | None = None
        self._grad_norm: float | None = None
        self._closed = False

    # -- subclass hooks -------------------------------------------------------------

    @abstractmethod
    def _wrap(self, model: nn.Module) -> nn.Module:
        """The model wrapped for this backend (DDP, or FSDP2's sharded module)."""

    def _autocast(self) -> contextlib.AbstractContextManager[Any]:
        return contextlib.nullcontext()

    def _describe(self) -> dict[str, Any]:
        return {}

    # -- training -------------------------------------------------------------------

    def forward_backward(self, batch: Any) -> dict[str, Any]:
        """One forward and backward pass; gradients accumulate until :meth:`optim_step`.

        Returns ``loss`` (mean over ranks), ``grad_norm`` (global, of the
        gradients accumulated so far), ``examples`` (over all ranks) and, for
        integer inputs (token ids), ``tokens`` (labels, or the ``loss_mask`` sum).
        """
        self._check_open()
        inputs, labels, extra = _split_batch(batch, self.device)
        self.model.train()
        with self._autocast():
            outputs = self.model(inputs)
            loss = self.loss_fn(outputs, labels, **extra)
        torch.autograd.backward(loss)
        self._grad_norm = self._total_grad_norm()
        mask = extra.get("loss_mask")
        tokens = mask.sum().item() if mask is not None else labels.numel()
        examples = inputs.shape[0] if inputs.dim() else 1
        stats = torch.tensor([0.0, float(tokens), float(examples)], dtype=torch.float64)
        stats = stats.to(self.device)
        stats[0] = loss.detach()
        dist.all_reduce(stats)  # SUM: gloo has no AVG
        total_loss, total_tokens, total_examples = stats.tolist()
        metrics: dict[str, Any] = {
            "loss": total_loss / self.world_size,
            "grad_norm": self._grad_norm,
            "examples": int(total_examples),
            "step": self.step,
        }
        if not inputs.is_floating_point():
            metrics["tokens"] = int(total_tokens)
        return metrics

    def optim_step(self) -> dict[str, Any]:
        """Clip to ``max_grad_norm``, step the optimizer and the LR schedule, zero the grads.

        A non-finite gradient norm skips the update (``skipped``: True). Returns
        the ``lr`` used, the new ``step``, and the pre-clip ``grad_norm``.
        """
        self._check_open()
        norm = self._grad_norm if self._grad_norm is not None else self._total_grad_norm()
        lr = float(self.optimizer.param_groups[0]["lr"])
        skipped = not math.isfinite(norm)
        if skipped:
            _say_once(f"non-finite gradient norm ({norm}) at step {self.step}: update skipped")
        else:
            limit = self.config.max_grad_norm
            if limit is not None and norm > limit:
                grads = [p.grad for p in self.model.parameters() if p.grad is not None]
                torch._foreach_mul_(grads, limit / (norm + 1e-6))
            self.optimizer.step()
            self.scheduler.step()
            self.step += 1
        self.optimizer.zero_grad(set_to_none=True)
        self._grad_norm = None
        return {"lr": lr, "step": self.step, "grad_norm": norm, "skipped": skipped}

    def _total_grad_norm(self) -> float:
        grads = [p.grad for p in self.model.parameters() if p.grad is not None]
        if not grads:
            return 0.0
        return float(_full(torch.nn.utils.get_total_norm(grads, 2.0)))

    # -- checkpoints ----------------------------------------------------------------

    def _step_dir(self, step: int) -> Path:
        base = self.checkpoint_dir / f"step_{step:08d}"
        per_rank = self.config.checkpoint_layout == "per_rank"
        return base / f"rank_{self.rank:05d}" if per_rank else base

    def save_checkpoint(self, step: int | None = None) -> Path:
        """Save model, optimizer and schedule as checkpoint ``step`` (default: steps taken).

        Returns this rank's checkpoint directory. Complete when it returns on
        every rank; a crash mid-save leaves no checkpoint that loads.
        """
        from torch.distributed.checkpoint.filesystem import FileSystemWriter
        from torch.distributed.checkpoint.state_dict import get_state_dict
        from torch.distributed.checkpoint.state_dict_saver import save as dcp_save

        self._check_open()
        step = self.step if step is None else step
        model_state, optim_state = get_state_dict(self.module, self.optimizer)
        extra = {"optim_steps": self.step, "scheduler": self.scheduler.state_dict()}
        state = {"model": model_state, "optim": optim_state, "extra": extra}
        meta = {
            "format": 1,
            "backend": self.kind,
            "step": step,
            "world_size": self.world_size,
            "rank": self.rank,
            "layout": self.config.checkpoint_layout,
            **self._describe(),
        }
        final = self._step_dir(step)
        if self.config.checkpoint_layout == "per_rank":
            tmp = final.with_name(f"{final.name}.tmp{os.getpid()}")
            shutil.rmtree(tmp, ignore_errors=True)
            with _rank_local():
                dcp_save(state, storage_writer=FileSystemWriter(tmp), no_dist=True)
            (tmp / _META).write_text(json.dumps(meta))
            shutil.rmtree(final, ignore_errors=True)
            tmp.rename(final)
        else:
            if self.rank == 0:
                shutil.rmtree(final, ignore_errors=True)
            dist.barrier()
            dcp_save(state, storage_writer=FileSystemWriter(final))
            if self.rank == 0:
                (final / _META).write_text(json.dumps(meta))  # written last: marks it complete
        dist.barrier()
        self.last_checkpoint = step
        return final

    def _visible_checkpoints(self) -> dict[int, int]:
        """``{step: saved world size}`` for the complete checkpoints this rank can read."""
        found: dict[int, int] = {}
        for path in self.checkpoint_dir.glob("step_*"):
            try:
                step = int(path.name.removeprefix("step_"))
            except ValueError:
                continue
            meta = _read_meta(self._step_dir(step))
            if meta is not None and meta.get("layout") == self.config.checkpoint_layout:
                found[step] = int(meta["world_size"])
        return found

    def load_checkpoint(self, step: int | None = None) -> int | None:
        """Restore the latest checkpoint every rank can read (or ``step``); None if there is none.

        Raises :class:`ConfigError` when the checkpoint cannot be resumed here
        (a per_rank checkpoint from another world size, a global one not shared).
        """
        from torch.distributed.checkpoint.filesystem import FileSystemReader
        from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
        from torch.distributed.checkpoint.state_dict_loader import load as dcp_load

        self._check_open()
        views: list[Any] = [None] * self.world_size
        dist.all_gather_object(views, self._visible_checkpoints())
        chosen = _choose_step(views, self.world_size, self.config.checkpoint_layout, step)
        if chosen is None:
            return None
        per_rank = self.config.checkpoint_layout == "per_rank"
        saved = _read_meta(self._step_dir(chosen)) or {}
        layout = {"backend": self.kind, **self._describe()}
        if per_rank and any(saved.get(k) != v for k, v in layout.items()):
            was = " ".join(str(saved[k]) for k in ("backend", "sharding_strategy") if k in saved)
            raise ConfigError(  # the same on every rank: all ranks wrote the same meta
                f"checkpoint step {chosen} was saved by {was}, this is "
                f"{' '.join(layout.values())}: "
                "per_rank checkpoints resume only with the same backend and sharding",
                option="checkpoint_dir",
            )
        model_state, optim_state = get_state_dict(self.module, self.optimizer)
        extra = {"optim_steps": 0, "scheduler": self.scheduler.state_dict()}
        state: dict[str, Any] = {"model": model_state, "optim": optim_state, "extra": extra}
        reader = FileSystemReader(self._step_dir(chosen))
        with _rank_local() if per_rank else contextlib.nullcontext():
            dcp_load(state, storage_reader=reader, no_dist=per_rank)
        set_state_dict(
            self.module, self.optimizer,
            model_state_dict=state["model"], optim_state_dict=state["optim"],
        )  # fmt: skip
        self.scheduler.load_state_dict(state["extra"]["scheduler"])
        self.step = int(state["extra"]["optim_steps"])
        self.optimizer.zero_grad(set_to_none=True)
        self._grad_norm = None
        self.last_checkpoint = chosen
        return chosen

    def full_model_state_dict(self, rank0_only: bool = True) -> dict[str, torch.Tensor]:
        """The whole unsharded model state on CPU (collective); empty off rank 0 if rank0_only."""
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

        options = StateDictOptions(full_state_dict=True, cpu_offload=rank0_only)
        state: dict[str, Any] = get_model_state_dict(self.module, options=options)
        return {k: v.detach().cpu() for k, v in state.items()}

    # -- lifecycle ------------------------------------------------------------------

    def state(self) -> dict[str, Any]:
        """A JSON-ready summary: backend, rank, device, precision, step, lr, checkpoints."""
        return {
            "backend": self.kind,
            "rank": self.rank,
            "world_size": self.world_size,
            "device": str(self.device),
            "mixed_precision": self.precision,
            "step": self.step,
            "lr": float(self.optimizer.param_groups[0]["lr"]),
            "checkpoint_dir": str(self.checkpoint_dir),
            "checkpoint_layout": self.config.checkpoint_layout,
            "last_checkpoint": self.last_checkpoint,
            "closed": self._closed,
            **self._describe(),
        }

    def shutdown(self) -> None:
        """Stop; destroy the process group if this backend created it (safe to repeat)."""
        if self._closed:
            return
        self._closed = True
        # Free the DDP/FSDP wrapper (a reference cycle) now: collected at interpreter exit
        # instead, its reducer can abort the process ("terminate called without an active
        # exception") once the group is gone.
        self.model = self.module
        gc.collect()
        if self._owns_group and dist.is_initialized():
            dist.destroy_process_group()

    def __enter__(self) -> TrainingBackend:
        return self

    def __exit__(self, *exc: object) -> None:
        self.shutdown()

    def _check_open(self) -> None:
        if self._closed:
            raise RuntimeError(f"{type(self).__name__} is shut down")

    def _agree_precision(self, wanted: Literal["bf16", "fp32"]) -> Literal["bf16", "fp32"]:
        """bf16 only if every rank supports it natively; rank 0 says once why not."""
        if wanted == "fp32":
            return "fp32"
        votes: list[Any] = [None] * self.world_size
        dist.all_gather_object(votes, _bf16_support(self.device))
        unsupported = {r: why for r, (ok, why) in enumerate(votes) if not ok}
        if not unsupported:
            return "bf16"
        if self.rank == 0:
            reasons = "; ".join(sorted({why for why in unsupported.values()}))
            _say_once(
                f"mixed_precision='bf16' falls back to fp32 on all ranks: rank(s) "
                f"{sorted(unsupported)}: {reasons}"
            )
        return "fp32"


class DDPTrainingBackend(TrainingBackend):
    """DistributedDataParallel: a full replica per rank, gradients all-reduced in backward."""

    kind = "ddp"
    config_type = DDPConfig
    config: DDPConfig

    def _wrap(self, model: nn.Module) -> nn.Module:
        from torch.nn.parallel import DistributedDataParallel

        ids = [self.device.index] if self.device.type == "cuda" else None
        return DistributedDataParallel(
            model, device_ids=ids, find_unused_parameters=self.config.find_unused_parameters
        )

    def _autocast(self) -> contextlib.AbstractContextManager[Any]:
        return torch.autocast(self.device.type, torch.bfloat16, enabled=self.precision == "bf16")


class FSDPTrainingBackend(TrainingBackend):
    """FSDP2 (``fully_shard``) over a 1-D mesh of all ranks (NO_SHARD: replicate x 1)."""

    kind = "fsdp"
    config_type = FSDPConfig
    config: FSDPConfig

    def _wrap(self, model: nn.Module) -> nn.Module:
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

        strategy = self.config.sharding_strategy
        if strategy == "NO_SHARD":
            mesh = init_device_mesh(
                self.device.type, (self.world_size, 1), mesh_dim_names=("replicate", "shard")
            )
        else:
            mesh = init_device_mesh(self.device.type, (self.world_size,), mesh_dim_names=("shard",))
        policy = MixedPrecisionPolicy()
        if self.precision == "bf16":
            policy = MixedPrecisionPolicy(
                param_dtype=torch.bfloat16, reduce_dtype=torch.float32, output_dtype=torch.float32
            )
        reshard = strategy == "FULL_SHARD"
        for unit in self._units(model):
            fully_shard(unit, mesh=mesh, reshard_after_forward=reshard, mp_policy=policy)
        fully_shard(model, mesh=mesh, reshard_after_forward=reshard, mp_policy=policy)
        return model

    def _units(self, model: nn.Module) -> list[nn.Module]:
        """Submodules to shard on their own, children before parents."""
        wanted = self.config.shard_modules
        if wanted:
            return [
                m for m in reversed(list(model.modules()))
                if m is not model and any(
                    type(m).__name__ == w if isinstance(w, str) else isinstance(m, w)
                    for w in wanted
                )
            ]  # fmt: skip

        def children(module: nn.Module) -> Iterator[nn.Module]:
            for child in module.children():
                if isinstance(child, (nn.ModuleList, nn.ModuleDict)):
                    yield from children(child)
                elif next(child.parameters(), None) is not None:
                    yield child

        return list(children(model))

    def _describe(self) -> dict[str, Any]:
        return {"sharding_strategy": self.config.sharding_strategy}
