"""In-place recovery with torchft: one call makes a training script fault tolerant.

Each replica group (under corral, one node: its local ranks started by one
``torchrun`` with its own store) is a data-parallel replica of the others.
torchft's Lighthouse forms a quorum of the live groups before every step; when a
group dies the survivors go on with a smaller quorum at the next step, and a
group that comes back heals from a live peer's weights (torchft's checkpoint
transport), not from disk.

```python
from corral import sdk

ft = sdk.fault_tolerant(model, optimizer, global_batch=256, dataset_size=len(data))
model, optimizer = ft.model, ft.optimizer
ft.resume("ckpts")                          # whole-job loss: the newest disk checkpoint
while ft.step < total:
    optimizer.zero_grad()                   # starts the step's quorum
    x, y = data[ft.indices()]               # this rank's share of the step's global batch
    (loss_fn(model(x), y) * ft.loss_scale).backward()
    optimizer.step()                        # commits only when the quorum agrees
    ft.save("ckpts", every=100)
ft.shutdown()
```

The environment (corral sets all of it under ``--recovery in-place``; without
corral set it yourself): ``TORCHFT_LIGHTHOUSE`` (the Lighthouse's
``http://host:port``), ``CORRAL_REPLICA_GROUP`` (this group's id, 0 to groups -
1), ``CORRAL_REPLICA_GROUPS`` (the configured number of groups; needed with
weights), ``CORRAL_MIN_REPLICAS`` (fewest groups that may commit a step,
default 1), the group's own ``MASTER_ADDR``/``MASTER_PORT``/``RANK``/
``WORLD_SIZE`` (torchrun's; under plain ``python`` the SDK hosts a store on a
free port itself) and, for a proportional split, ``CORRAL_WORKLOAD_WEIGHTS``
(see :func:`corral.sdk._ftsplit.group_weights`). The sharding is documented in
:mod:`corral.sdk._ftsplit`.
"""

from __future__ import annotations

import logging
import os
import socket
import sys
from collections.abc import Callable, Mapping
from datetime import timedelta
from pathlib import Path
from typing import Any, Literal

from corral.contract import (
    FT_QUORUM_TIMEOUT_DEFAULT,
    FT_QUORUM_TIMEOUT_ENV,
    FT_TIMEOUT_DEFAULT,
    FT_TIMEOUT_ENV,
    LIGHTHOUSE_ENV,
    MIN_REPLICAS_ENV,
    REPLICA_GROUP_ENV,
    REPLICA_GROUPS_ENV,
    WORKLOAD_WEIGHTS_ENV,
)
from corral.sdk._checkpoint import save_checkpoint
from corral.sdk._env import info
from corral.sdk._ftids import reconfigurable, unique_quorum_ids
from corral.sdk._ftlog import quiet_torchft
from corral.sdk._ftsplit import Share, group_weights, quorum_share, stream_indices
from corral.sdk._ftstate import Carried, StateMismatch, mismatches
from corral.sdk._ftsync import SemiSync, Sync, parse_sync
from corral.sdk._report import send_event
from corral.sdk._resume import resume

__all__ = ["FaultTolerant", "fault_tolerant"]

INSTALL_HINT = "pip install 'corral[ft]'"
Backend = Literal["auto", "gloo", "nccl"]


def _torchft() -> Any:
    try:
        import torchft
    except ImportError as exc:
        raise ImportError(
            f"sdk.fault_tolerant needs torchft, which is not installed in {sys.executable}: "
            f"{INSTALL_HINT} (installs torchft-nightly)"
        ) from exc
    return torchft


def _env_int(env: Mapping[str, str], name: str, default: int | None) -> int | None:
    raw = env.get(name, "").strip()
    if not raw:
        return default
    try:
        value = int(raw)
    except ValueError:
        raise ValueError(f"{name}={raw!r} is not an integer") from None
    if value < 0:
        raise ValueError(f"{name}={raw!r} must not be negative")
    return value


def _env_seconds(env: Mapping[str, str], name: str, given: float) -> float:
    """torchft's override ``env[name]`` (whole seconds, as its Manager reads it) when set,
    else ``given``; ValueError naming the variable for a value torchft cannot use."""
    value = _env_int(env, name, None)
    if value is None:
        return given
    if value < 1:
        raise ValueError(f"{name}={value} must be at least 1 second")
    return float(value)


def _tap(owner: FaultTolerant) -> Callable[[logging.LogRecord], None]:
    """Tells corral about healing from torchft's log records (its lines themselves
    are shown or not by :class:`~corral.sdk._ftlog.TorchftGate`)."""

    def tap(record: logging.LogRecord) -> None:
        if owner.group_rank != 0:
            return
        message = record.getMessage()
        if "healing required" in message:
            owner._event("healing")
        elif "peers need recovery" in message:
            owner._event("sending")

    return tap


def _ddp_class(torchft: Any, group_size: int) -> Any:
    """torchft's DDP; with several ranks per group, one whose hook first averages
    the bucket over the group's own process group, then across the groups."""
    base = torchft.DistributedDataParallel
    if group_size == 1:
        return base

    class _GroupDDP(base):  # type: ignore[misc, valid-type]
        @staticmethod
        def _comm_hook(state: Any, bucket: Any) -> Any:
            import torch.distributed as dist

            buffer = bucket.buffer()
            dist.all_reduce(buffer)
            buffer.div_(group_size)
            return base._comm_hook(state, bucket)

    # DDP checks the hook's annotations as objects (these module's are strings)
    import torch
    import torch.distributed as dist

    _GroupDDP._comm_hook.__annotations__ = {
        "bucket": dist.GradBucket,  # type: ignore[attr-defined]
        "return": torch.futures.Future[torch.Tensor],
    }
    return _GroupDDP


def _optimizer_class(torchft: Any, owner: FaultTolerant) -> Any:
    """torchft's Optimizer wrapper whose ``zero_grad`` (the step's quorum) is followed
    by the comparison of the groups' states after a quorum change."""

    class _Compared(torchft.Optimizer):  # type: ignore[misc]
        def zero_grad(self, set_to_none: bool = True) -> None:
            super().zero_grad(set_to_none)
            owner._compare_states()

    return _Compared


def _transport(torchft: Any, hostname: str, timeout: timedelta) -> Any:
    """torchft's HTTP checkpoint transport (its default), advertising ``hostname``
    instead of ``socket.gethostname()``."""
    base = torchft.checkpointing.HTTPTransport

    class _Advertised(base):  # type: ignore[misc, valid-type]
        def address(self) -> str:
            port = self._server.socket.getsockname()[1]
            return f"http://{_url_host(hostname)}:{port}/checkpoint/"

    return _Advertised(timeout=timeout, num_chunks=0)


def _url_host(host: str) -> str:
    """``host`` as the host part of a URL (IPv6 literals bracketed)."""
    return f"[{host}]" if ":" in host and not host.startswith("[") else host


class FaultTolerant:
    """A script's torchft state: the Manager, the wrapped model and optimizer, and
    this step's share of the global batch (see :func:`fault_tolerant`)."""

    def __init__(
        self,
        model: Any,
        optimizer: Any,
        *,
        global_batch: int | None,
        dataset_size: int | None,
        seed: int,
        shuffle: bool,
        weights: str | None,
        min_replicas: int | None,
        backend: Backend,
        timeout: float,
        quorum_timeout: float,
        replica_group: int | None,
        replica_groups: int | None,
        lighthouse: str | None,
        env: Mapping[str, str],
        state: Mapping[str, Any] | None = None,
        sync: Sync | None = None,
        every: int | None = None,
        outer_optimizer: Any = None,
    ) -> None:
        # torchft at warnings, its quorum changes shown: before torchft starts logging
        self._gate = quiet_torchft()
        torchft = _torchft()
        import torch
        import torch.distributed as dist

        me = info(env)
        group = (
            replica_group if replica_group is not None else _env_int(env, REPLICA_GROUP_ENV, None)
        )
        if group is None:
            raise ValueError(
                f"sdk.fault_tolerant: which replica group is this? set {REPLICA_GROUP_ENV} "
                "(0 to groups - 1; corral sets it under --recovery in-place) or pass replica_group="
            )
        lighthouse = lighthouse or env.get(LIGHTHOUSE_ENV, "").strip()
        if not lighthouse:
            raise ValueError(
                f"sdk.fault_tolerant: no Lighthouse: set {LIGHTHOUSE_ENV}=http://HOST:PORT "
                "(corral starts one under --recovery in-place; by hand: torchft_lighthouse "
                "--min_replicas 1) or pass lighthouse="
            )
        groups = (
            replica_groups
            if replica_groups is not None
            else _env_int(env, REPLICA_GROUPS_ENV, None)
        )
        minimum = min_replicas if min_replicas is not None else _env_int(env, MIN_REPLICAS_ENV, 1)
        assert minimum is not None
        if minimum < 1:
            raise ValueError(f"min_replicas must be at least 1, got {minimum}")
        if groups is not None and not 0 <= group < groups:
            raise ValueError(
                f"replica group {group} is outside 0..{groups - 1} ({REPLICA_GROUPS_ENV})"
            )
        if global_batch is not None and (isinstance(global_batch, bool) or global_batch < 1):
            raise ValueError(f"global_batch must be a positive integer, got {global_batch!r}")
        if dataset_size is not None and global_batch is None:
            raise ValueError("dataset_size needs global_batch (the examples every step reads)")

        self.group, self.groups = group, groups
        self.carried = Carried(state)
        self.sync, sync_every = parse_sync(sync, every, env)
        self._semi: SemiSync | None = None
        self.group_rank, self.group_size = me.rank, me.world_size
        self.global_batch, self.dataset_size = global_batch, dataset_size
        self.seed, self.shuffle = seed, shuffle
        self._weights: tuple[float, ...] | None = None
        self._local_weights: tuple[float, ...] = (1.0,) * self.group_size
        raw = weights if weights is not None else env.get(WORKLOAD_WEIGHTS_ENV, "").strip()
        if raw and self.sync != "ddp":
            raise ValueError(
                f"weights ({WORKLOAD_WEIGHTS_ENV}) split each step's batch among the live "
                f"groups: sync={self.sync!r} trains each group on its own (unset them)"
            )
        if raw:
            if groups is None:
                raise ValueError(
                    f"weights ({WORKLOAD_WEIGHTS_ENV}) need the number of replica groups: "
                    f"set {REPLICA_GROUPS_ENV} or pass replica_groups="
                )
            per_group, per_rank = group_weights(
                raw, groups, self.group_size, source=WORKLOAD_WEIGHTS_ENV
            )
            self._weights, self._local_weights = per_group, per_rank[group]

        on_gpu = any(p.is_cuda for p in model.parameters())
        chosen = ("nccl" if on_gpu else "gloo") if backend == "auto" else backend
        if chosen not in ("gloo", "nccl"):
            raise ValueError(f"backend must be 'auto', 'gloo' or 'nccl', got {backend!r}")
        self.backend = chosen
        # TORCHFT_TIMEOUT_SEC overrides timeout= everywhere, as torchft's Manager does for
        # its own waits: the process group (its gloo/NCCL connect and collectives), the
        # group's own process group and the checkpoint transport too
        timeout = _env_seconds(env, FT_TIMEOUT_ENV, timeout)
        quorum_timeout = _env_seconds(env, FT_QUORUM_TIMEOUT_ENV, quorum_timeout)
        self.timeout, self.quorum_timeout = timeout, quorum_timeout
        pg_timeout = timedelta(seconds=timeout)
        if self.group_size > 1 and not dist.is_initialized():
            from corral.sdk._dist import init_distributed

            init_distributed("nccl" if on_gpu else "gloo", timeout=timeout)
        store_addr, store_port = me.master_addr, None
        self._store: Any = None
        if self.group_size == 1:
            # one rank (plain python, or corral's --launcher python, whose MASTER_PORT
            # no one serves): host the group's store ourselves
            store_class: Any = dist.TCPStore  # type: ignore[attr-defined]
            self._store = store_class("127.0.0.1", 0, 1, True, wait_for_workers=False)
            store_addr, store_port = "127.0.0.1", int(self._store.port)
        else:
            store_port = me.master_port
        # quorum ids unique across Lighthouse restarts (corral.sdk._ftids)
        pg_class = torchft.ProcessGroupBabyNCCL if chosen == "nccl" else torchft.ProcessGroupGloo
        pg = reconfigurable(pg_class)(timeout=pg_timeout)
        self._inner_model, self._inner_optimizer = model, optimizer
        # what the other groups dial (this group's manager, its checkpoint server for a
        # healing peer): the group's own MASTER_ADDR, which corral sets to the address
        # the coordinator reaches the host by; torchft's default, the machine's
        # hostname, may not resolve on the peers
        advertised = env.get("MASTER_ADDR", "").strip() or socket.gethostname()
        self.manager: Any = torchft.Manager(
            pg=pg,
            min_replica_size=minimum,
            load_state_dict=self._load_user_state,
            # carried objects heal at the start of the step, where their snapshot is
            # taken (a quorum that waits, as ft.indices() makes it anyway)
            # (and DiLoCo/LocalSGD heal at their sync's quorum: torchft requires it)
            use_async_quorum=not self.carried and self.sync == "ddp",
            state_dict=self._user_state,
            replica_id=f"corral_{group}",
            rank=me.rank,
            world_size=me.world_size,
            store_addr=store_addr,
            store_port=store_port,
            lighthouse_addr=lighthouse,
            timeout=pg_timeout,
            quorum_timeout=timedelta(seconds=quorum_timeout),
            connect_timeout=pg_timeout,
            hostname=_url_host(advertised),
            checkpoint_transport=_transport(torchft, advertised, pg_timeout),
        )
        unique_quorum_ids(self.manager)
        self._gate.tap = _tap(self)
        if self.sync == "ddp":
            self.model: Any = _ddp_class(torchft, self.group_size)(self.manager, model)
            self.optimizer: Any = _optimizer_class(torchft, self)(self.manager, optimizer)
        else:
            # local steps: within the group plain DDP (the group's own process group)
            self.model = (
                torch.nn.parallel.DistributedDataParallel(model) if self.group_size > 1 else model
            )
            self.optimizer = optimizer
            self._semi = SemiSync(
                self.manager,
                model,
                optimizer,
                mode=self.sync,
                every=sync_every,
                outer_optimizer=outer_optimizer,
                carried=self.carried,
                group_rank=self.group_rank,
                compare=self._compare_states,
            )
        self._quorum_seen: object = None  # the quorum id the states were last compared in
        self._torch = torch
        self._last: tuple[int, bool] | None = None
        self._share: Share | None = None
        self._saved_at = 0  # the step of the last disk checkpoint (semi-synchronous)

    # --- state -------------------------------------------------------------------------
    def _user_state(self) -> dict[str, Any]:
        state = {
            "model": self._inner_model.state_dict(),
            "optimizer": self._inner_optimizer.state_dict(),
        }
        if self.carried:
            state["objects"] = self.carried.snapshot()
        if self._semi is not None:
            state["schedule"] = self._semi.schedule()
        return state

    def _load_user_state(self, state: dict[str, Any]) -> None:
        self._inner_model.load_state_dict(state["model"])
        self._inner_optimizer.load_state_dict(state["optimizer"])
        if self.carried:
            self.carried.load(state.get("objects") or {})
        if self._semi is not None:
            self._semi.load_schedule(state["schedule"])

    def _compare_states(self) -> None:
        """After a quorum change (a group joined, healed or left), every group hashes
        the model, the optimizer and the carried objects and they compare: any that
        differs fails every group, named (:class:`~corral.sdk._ftstate.StateMismatch`).
        With ``sync="diloco"``/``"localsgd"``: at a sync's start, what must be equal then
        (:meth:`~corral.sdk._ftsync.SemiSync.digests`)."""
        quorum = getattr(self.manager, "_quorum_id", None)
        if not self.carried or quorum == self._quorum_seen:
            return
        prank = self.manager.participating_rank()
        n = self.manager.num_participants()
        if prank is None or self.manager.errored() is not None:
            return  # not in this step: compared at the next change
        torch = self._torch
        if self._semi is not None:
            names, values = self._semi.digests()
        else:
            names = self.carried.names()
            values = self.carried.digests(self._inner_model, self._inner_optimizer)
        rows = torch.zeros((n, len(names) + 1), dtype=torch.int64)
        rows[prank, 0] = self.group
        rows[prank, 1:] = torch.tensor(values, dtype=torch.int64)
        from torch.distributed import ReduceOp

        done = self.manager.allreduce(rows, reduce_op=ReduceOp.SUM).wait()
        if done is False or self.manager.errored() is not None:
            return  # a group went away meanwhile: compared at the next change
        self._quorum_seen = quorum
        differ = mismatches(names, rows.tolist())
        if differ:
            # stop torchft's threads (its server, the quorum's), or the process would
            # outlive this error waiting for them
            self.shutdown()
            raise StateMismatch(
                f"sdk.fault_tolerant: after the quorum change at step {self.step} the replica "
                f"groups hold different states: {'; '.join(differ)}. A heal did not carry it "
                "(pass it in state= with a load_state_dict that restores it) or the groups "
                "did not start from the same one"
            )

    def state_dict(self) -> dict[str, Any]:
        """Model, optimizer, the step and torchft's manager state (for a disk checkpoint)."""
        state = {**self._user_state(), "torchft": self.manager.state_dict(), "step": self.step}
        if self._semi is not None:
            state["sync"] = self._semi.state_dict()
        return state

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore :meth:`state_dict` (the manager's step included, as torchft requires)."""
        self._load_user_state(dict(state))
        self.manager.load_state_dict(state["torchft"])
        if self._semi is not None:
            self._semi.load_state_dict(state["sync"])

    def save(
        self, directory: str | os.PathLike[str], *, every: int = 1, keep: int | None = 3
    ) -> Path | None:
        """Write a disk checkpoint of :meth:`state_dict` when ``step`` is a multiple of
        ``every``: rank 0 of the live group with participating rank 0 writes (exactly one
        writer per step, whichever groups are alive). Returns the path, None elsewhere.
        With ``sync="diloco"``/``"localsgd"``: right after the first sync at or past each
        multiple of ``every`` (between syncs the groups' weights differ)."""
        step = self.step
        if self._semi is not None:
            if self._semi.local_step != 0 or step // every <= self._saved_at // every:
                return None
            self._saved_at = step
        elif step % every != 0:
            return None
        if step == 0 or self.group_rank != 0:
            return None
        if self.manager.participating_rank() != 0 or self.manager.errored() is not None:
            return None
        return save_checkpoint(self.state_dict(), directory, step, keep=keep)

    def resume(self, directory: str | os.PathLike[str] | None = None) -> int:
        """Load the newest complete disk checkpoint (``sdk.resume``) into the model,
        the optimizer and the manager; the step it reached (0 when there is none).
        A group that joins a running quorum heals from a live peer afterwards anyway."""
        state = resume(directory)
        if state is None or "torchft" not in state:
            return 0
        self.load_state_dict(state)
        self._saved_at = self.step
        return self.step

    # --- the step ----------------------------------------------------------------------
    @property
    def step(self) -> int:
        """torchft's committed step count (the same on every participant); with
        ``sync="diloco"``/``"localsgd"`` the local steps kept (see :attr:`syncs`)."""
        if self._semi is not None:
            return self._semi.step
        return int(self.manager.current_step())

    @property
    def syncs(self) -> int:
        """Committed syncs: the steps with ``sync="ddp"``, the outer steps otherwise."""
        return int(self.manager.current_step())

    @property
    def every(self) -> int:
        """Steps between syncs (1 with ``sync="ddp"``; while corral measures, the probe's)."""
        return 1 if self._semi is None else self._semi.every

    def final_sync(self) -> bool:
        """With ``sync="diloco"``/``"localsgd"``: sync the local steps made since the
        last sync now, so that every group ends with the shared model (call it on every
        group at the same step, e.g. after the training loop). False when nothing was
        pending (and with ``sync="ddp"``, which syncs every step)."""
        return self._semi is not None and self._semi.final_sync()

    @property
    def every_settled(self) -> bool:
        """Whether :attr:`every` is final: given, or chosen by the groups together."""
        return self._semi is None or self._semi.agreed

    @property
    def participants(self) -> int:
        """The replica groups taking part in the current step (waits for the quorum);
        with ``sync="diloco"``/``"localsgd"``, in the last sync (before the first: the
        configured groups)."""
        if self._semi is not None and self.manager.participating_rank() is None:
            return self.groups or 1
        return int(self.manager.num_participants())

    def _live(self) -> dict[int, float]:
        """The participating groups and their weights (this step's quorum)."""
        prank = self.manager.participating_rank()
        n = self.manager.num_participants()
        if self._weights is None:
            # equal weights: the quorum's participating ranks are the group ids
            return {r: 1.0 for r in range(n)}
        torch = self._torch
        # which groups take part: each adds 1 at its id (torchft zeroes a non-participant's)
        flags = torch.zeros(len(self._weights), dtype=torch.float32)
        flags[self.group] = 1.0
        from torch.distributed import ReduceOp

        if not self.manager.allreduce(flags, reduce_op=ReduceOp.SUM).wait():
            flags.zero_()
        live = {g: self._weights[g] for g in range(len(self._weights)) if flags[g] > 0.5}
        if prank is not None and (self.manager.errored() is not None or self.group not in live):
            live = {self.group: self._weights[self.group]}  # this step will not commit anyway
        return live

    def share(self) -> Share:
        """This rank's share of the current step's global batch (call it after
        ``optimizer.zero_grad()``, which starts the step's quorum)."""
        if self.global_batch is None:
            raise ValueError("share() needs global_batch= in sdk.fault_tolerant")
        if self._semi is not None:  # the last sync's groups (no collective between syncs)
            prank = self.manager.participating_rank()
            live = {g: 1.0 for g in range(self.participants)}
            me: int | None = self.group if prank is None else prank
        else:
            live = self._live()
            me = self.group if self._weights is not None else self.manager.participating_rank()
        share = quorum_share(
            self.step,
            self.global_batch,
            live,
            -1 if me is None else me,
            self.group_rank,
            self._local_weights,
        )
        self._share = share
        key = (share.participants, share.participating)
        if key != self._last:
            self._last = key
            if self.group_rank == 0:
                self._event("quorum")
        return share

    def indices(self) -> list[int]:
        """The dataset indices this rank reads in the current step (see :meth:`share`)."""
        if self.dataset_size is None:
            raise ValueError("indices() needs dataset_size= in sdk.fault_tolerant")
        share = self.share()
        return stream_indices(
            share.start, share.count, self.dataset_size, seed=self.seed, shuffle=self.shuffle
        )

    @property
    def loss_scale(self) -> float:
        """The factor for this rank's mean loss in the current step (from the last
        :meth:`share`/:meth:`indices`; 1.0 before either)."""
        return 1.0 if self._share is None else self._share.loss_scale

    @property
    def epoch(self) -> float:
        """Epochs read so far: committed steps * global batch / dataset size."""
        if self.global_batch is None or self.dataset_size is None:
            raise ValueError("epoch needs global_batch= and dataset_size=")
        return self.step * self.global_batch / self.dataset_size

    def _event(self, kind: str) -> None:
        share = self._share
        send_event(
            {
                "type": "quorum",
                "kind": kind,
                "group": self.group,
                "step": self.step,
                "participants": None if share is None else share.participants,
                "participating": None if share is None else share.participating,
            }
        )

    def shutdown(self) -> None:
        """Stop the manager (its server and checkpoint transport)."""
        self._gate.tap = None
        self.manager.shutdown(wait=False)

    def __enter__(self) -> FaultTolerant:
        return self

    def __exit__(self, *exc: object) -> None:
        self.shutdown()


def fault_tolerant(
    model: Any,
    optimizer: Any,
    *,
    global_batch: int | None = None,
    dataset_size: int | None = None,
    seed: int = 0,
    shuffle: bool = True,
    weights: str | None = None,
    min_replicas: int | None = None,
    backend: Backend = "auto",
    timeout: float = FT_TIMEOUT_DEFAULT,
    quorum_timeout: float = FT_QUORUM_TIMEOUT_DEFAULT,
    replica_group: int | None = None,
    replica_groups: int | None = None,
    lighthouse: str | None = None,
    env: Mapping[str, str] | None = None,
    state: Mapping[str, Any] | None = None,
    sync: Sync | None = None,
    every: int | None = None,
    outer_optimizer: Any = None,
) -> FaultTolerant:
    """Wrap ``model`` and ``optimizer`` for in-place recovery with torchft.

    Returns a :class:`FaultTolerant` whose ``model`` (torchft's
    DistributedDataParallel) and ``optimizer`` (torchft's Optimizer wrapper:
    ``zero_grad()`` starts the step's quorum, ``step()`` steps only when the
    quorum commits) replace the originals. ``backend="auto"`` picks NCCL when the
    model is on a GPU (torchft's ProcessGroupBabyNCCL) and gloo otherwise. With
    ``global_batch`` (and ``dataset_size``), :meth:`FaultTolerant.indices` gives
    each rank its share of every step's batch, following the live quorum (and
    the weights, default ``$CORRAL_WORKLOAD_WEIGHTS``), and
    :attr:`FaultTolerant.loss_scale` keeps the update that of the global batch.
    ``timeout`` bounds the process group (its connect and collectives) and healing,
    ``quorum_timeout`` the wait for a quorum (seconds; torchft's ``TORCHFT_TIMEOUT_SEC``
    / ``TORCHFT_QUORUM_TIMEOUT_SEC``, whole seconds, override them:
    :attr:`FaultTolerant.timeout` / ``quorum_timeout`` are the values in force).
    ``state``: more objects to carry through a heal, by name (anything with
    ``state_dict``/``load_state_dict``: an LR scheduler, a grad scaler, a sampler,
    :class:`~corral.sdk.RNGState`); they are saved with :meth:`FaultTolerant.save`
    too, and after every quorum change the groups compare digests of the model, the
    optimizer and each of them, failing with :class:`~corral.sdk.StateMismatch`
    naming any that differs (:mod:`corral.sdk._ftstate`). The other settings default
    to the environment (module doc). ``sync``: ``"ddp"`` (every step; the default, or
    ``$CORRAL_FT_SYNC``), or ``"diloco"``/``"localsgd"`` (torchft's, semi-synchronous:
    ``ft.model``/``ft.optimizer`` are the originals, the groups sync every ``every``
    steps, default ``$CORRAL_FT_SYNC_EVERY``, else chosen by corral from the measured
    sync and step times; DiLoCo's ``outer_optimizer`` defaults to SGD lr 0.7, Nesterov
    momentum 0.9): :mod:`corral.sdk._ftsync`. ImportError naming ``corral[ft]`` when torchft
    is missing; ValueError for missing or bad settings, TypeError for a ``state``
    object without ``state_dict``/``load_state_dict``.
    """
    return FaultTolerant(
        model,
        optimizer,
        global_batch=global_batch,
        dataset_size=dataset_size,
        seed=seed,
        shuffle=shuffle,
        weights=weights,
        min_replicas=min_replicas,
        backend=backend,
        timeout=timeout,
        quorum_timeout=quorum_timeout,
        replica_group=replica_group,
        replica_groups=replica_groups,
        lighthouse=lighthouse,
        env=os.environ if env is None else env,
        state=state,
        sync=sync,
        every=every,
        outer_optimizer=outer_optimizer,
    )
