"""Semi-synchronous training under ``sdk.fault_tolerant``: torchft's DiLoCo and
LocalSGD, with the recovery guarantees of the per-step (DDP) mode.

``sdk.fault_tolerant(model, optimizer, sync="diloco", every=H)`` (or
``$CORRAL_FT_SYNC`` / ``$CORRAL_FT_SYNC_EVERY``): every replica group trains its
own copy of the model with the inner ``optimizer`` for ``H`` steps without talking
to the others, then the groups synchronise once:

* ``"diloco"`` (torchft's :class:`~torchft.local_sgd.DiLoCo`): the groups average
  their pseudo-gradients (the weights at the last sync minus their own) and an
  outer optimizer (default: SGD, lr 0.7, Nesterov momentum 0.9, as in the DiLoCo
  paper) steps the shared weights with it;
* ``"localsgd"`` (torchft's :class:`~torchft.local_sgd.LocalSGD`): the groups
  average their weights.

Each sync is one torchft quorum and one all-reduce of the model; everything
between syncs is local. Recovery is the DDP mode's: a lost group leaves the next
sync's quorum and the survivors go on; a group that comes back heals from a live
peer at the sync it joins (model, inner optimizer, DiLoCo's shared weights and
outer optimizer, the sync schedule and the ``state=`` objects), and after every
quorum change the groups compare digests of what must be equal at a sync start
(DiLoCo: the shared weights, the outer optimizer; both: the schedule and the
``state=`` objects) and fail naming any that differs. A sync that does not
commit (a group died during it) discards the ``H`` local steps: DiLoCo puts the
weights back to the last sync, and the step count (:attr:`SemiSync.step`) goes
back with them.

**How corral chooses H** (``every=None``): the first syncs come every
:data:`PROBE_EVERY` steps while each group measures its local step time (the
median of its last 64 steps, the syncs left out: forward, backward, the inner
optimizer, the script's own work) and the time of a sync's all-reduce and commit
over the real link (only a sync between two or more groups whose quorum did not
change: no new process group, no heal). At the next sync the groups average
their measurements in one small all-reduce and all take
``H = ceil(sync_s / (overhead * step_s))`` (:func:`choose_every`) with
``overhead = 0.1``: a sync then costs at most about 10 % of the time between
syncs. H is at most :data:`MAX_EVERY` (DiLoCo's paper trains well up to ~500).
A 1.2 MB model over a 20 Mbit/s link (about 0.5 s per all-reduce of two groups)
at 20 ms per step gives H = 250; over 10 Gbit/s (about 1 ms) H = 1.
"""

from __future__ import annotations

import math
import statistics
import sys
import time
from collections import deque
from collections.abc import Callable, Mapping
from typing import Any, Literal

from corral.contract import FT_SYNC_MODES
from corral.sdk._ftstate import Carried, digest

__all__ = [
    "MAX_EVERY",
    "OVERHEAD",
    "PROBE_EVERY",
    "SYNC_MODES",
    "SemiSync",
    "Sync",
    "choose_every",
    "parse_sync",
]

Sync = Literal["ddp", "diloco", "localsgd"]
SYNC_MODES: tuple[str, ...] = FT_SYNC_MODES
#: The share of the time between syncs a sync may cost (H's rule).
OVERHEAD = 0.1
#: The largest H corral chooses.
MAX_EVERY = 500
#: The interval of the first syncs, while H is measured.
PROBE_EVERY = 4
_STEP_SAMPLES = 64


def choose_every(
    sync_s: float, step_s: float, *, overhead: float = OVERHEAD, most: int = MAX_EVERY
) -> int:
    """Steps between syncs so that one sync (``sync_s``: its all-reduce and commit)
    costs at most ``overhead`` of the local steps between two syncs (``step_s``
    each): ``ceil(sync_s / (overhead * step_s))``, within 1 to ``most``."""
    if not overhead > 0:
        raise ValueError(f"overhead must be positive, got {overhead}")
    if most < 1:
        raise ValueError(f"most must be at least 1, got {most}")
    if not math.isfinite(sync_s) or not math.isfinite(step_s) or sync_s < 0 or step_s < 0:
        raise ValueError(f"times must be finite and non-negative: sync {sync_s}, step {step_s}")
    if step_s == 0:
        return most if sync_s > 0 else 1
    return max(1, min(most, math.ceil(sync_s / (overhead * step_s) - 1e-9)))


def parse_sync(
    sync: str | None, every: int | str | None, env: Mapping[str, str]
) -> tuple[str, int | None]:
    """The sync mode and H from the arguments, else ``$CORRAL_FT_SYNC`` and
    ``$CORRAL_FT_SYNC_EVERY`` (``auto`` or empty: corral chooses); ValueError naming
    a bad one."""
    from corral.contract import FT_SYNC_ENV, FT_SYNC_EVERY_ENV

    source, chosen_here = "sync=", sync is not None
    if sync is None:
        sync, source = env.get(FT_SYNC_ENV, "").strip().lower() or "ddp", FT_SYNC_ENV
    if sync not in SYNC_MODES:
        raise ValueError(f"{source}: {sync!r} is not one of {', '.join(SYNC_MODES)}")
    where = "every="
    if every is None:
        if sync == "ddp" and chosen_here:
            return sync, None  # the script's choice wins over the environment's mode
        every, where = env.get(FT_SYNC_EVERY_ENV, "").strip(), FT_SYNC_EVERY_ENV
    if every in ("", "auto"):
        return sync, None
    try:
        value = int(every)
    except (TypeError, ValueError):
        raise ValueError(f"{where}: {every!r} is not a whole number of steps (or auto)") from None
    if isinstance(every, bool) or value < 1:
        raise ValueError(f"{where}: {every!r} must be at least 1 step")
    if sync == "ddp" and value != 1:
        raise ValueError(
            f"{where}: {value} needs sync='diloco' or 'localsgd' (ddp syncs every step; "
            f"{FT_SYNC_ENV} sets it too)"
        )
    return sync, value


class SemiSync:
    """DiLoCo or LocalSGD on a torchft Manager, with corral's step count, H's choice
    and the digest comparison (see the module doc). Built by ``sdk.fault_tolerant``."""

    def __init__(
        self,
        manager: Any,
        model: Any,
        optimizer: Any,
        *,
        mode: str,
        every: int | None,
        outer_optimizer: Any,
        carried: Carried,
        group_rank: int,
        compare: Callable[[], None],
    ) -> None:
        import torch

        self.mode, self.manager, self.carried = mode, manager, carried
        self.group_rank, self._compare = group_rank, compare
        self.every = every if every is not None else PROBE_EVERY
        self.agreed = every is not None
        self.synced_steps = 0  # local steps covered by committed syncs
        self.chosen: dict[str, float] = {}  # what H was chosen from
        self.sync_seconds: float | None = None  # the last sync's all-reduce and commit
        self._step_times: deque[float] = deque(maxlen=_STEP_SAMPLES)
        self._mark: float | None = None
        self._torch = torch
        owner = self
        from torchft import local_sgd

        if mode == "diloco":
            outer = outer_optimizer or torch.optim.SGD(
                model.parameters(), lr=0.7, momentum=0.9, nesterov=True
            )

            class _DiLoCo(local_sgd.DiLoCo):  # type: ignore[misc]
                def _step_post_hook(self, *_: Any) -> None:
                    self._manager.allow_state_dict_read()
                    self._local_step += 1
                    if owner._local_done(self._local_step):
                        owner._sync()

            self.algorithm: Any = _DiLoCo(manager, [model], optimizer, outer, sync_every=self.every)
            self.outer_optimizer: Any = outer
            fragment = self.algorithm._fragments[0]
            self._prepare, self._perform = fragment.prepare_sync, fragment.perform_sync
        else:
            if outer_optimizer is not None:
                raise ValueError("outer_optimizer= is DiLoCo's (sync='diloco'), not LocalSGD's")

            class _LocalSGD(local_sgd.LocalSGD):  # type: ignore[misc]
                def _step_post_hook(self, *_: Any) -> None:
                    self._manager.allow_state_dict_read()
                    self._local_step += 1
                    if owner._local_done(self._local_step):
                        owner._sync()

            self.algorithm = _LocalSGD(manager, model, optimizer, sync_every=self.every)
            self.outer_optimizer = None
            self._prepare, self._perform = (lambda: None), self.algorithm._perform_sync
        self.algorithm.__enter__()  # the optimizer's hooks

    # --- the schedule ----------------------------------------------------------------
    @property
    def local_step(self) -> int:
        """Local steps since the last sync."""
        return int(self.algorithm._local_step)

    @property
    def step(self) -> int:
        """Local steps kept: those covered by committed syncs, plus those since."""
        return self.synced_steps + self.local_step

    def _local_done(self, local_step: int) -> bool:
        """After a local step: note its time; whether it is time to sync."""
        now = time.perf_counter()
        if self._mark is not None:
            self._step_times.append(now - self._mark)
        self._mark = now
        return local_step >= self.every

    def final_sync(self) -> bool:
        """Sync the local steps since the last sync now (every group at the same step),
        so that every group holds the shared model; False when none were pending."""
        if self.local_step == 0:
            return False
        self._sync(self.local_step)
        return True

    def _sync(self, steps: int | None = None) -> None:
        """One sync: the quorum (a joining group heals here), the digest comparison and
        H's agreement, then the algorithm's all-reduce and commit, of ``steps`` local
        steps (default: the schedule's interval, a healed group's the peer's)."""
        manager, algorithm = self.manager, self.algorithm
        quorum = getattr(manager, "_quorum_id", None)
        manager.start_quorum()
        # timed when it is between the same groups as the last (no new process group,
        # no heal) and between two or more
        steady = quorum == getattr(manager, "_quorum_id", None) and manager.num_participants() > 1
        # after a heal: the peer's schedule (its H for this interval, its steps kept)
        before, interval = manager.current_step(), steps or self.every
        self._after_quorum()
        started = time.perf_counter()
        self._prepare()
        self._perform()
        seconds = time.perf_counter() - started
        algorithm._local_step = 0
        if manager.current_step() > before:
            self.synced_steps += interval
            if steady:
                self.sync_seconds = seconds
        algorithm._sync_every = self.every
        self._mark = time.perf_counter()  # the next step's time leaves the sync out

    def _after_quorum(self) -> None:
        self._compare()  # after a quorum change, with state= objects
        if not self.agreed:
            self._agree()

    def _exchange(self, values: list[float]) -> list[float] | None:
        """The sum of ``values`` over the quorum's groups (None: it failed)."""
        torch = self._torch
        from torch.distributed import ReduceOp

        tensor = torch.tensor(values, dtype=torch.float64)
        done = self.manager.allreduce(tensor, reduce_op=ReduceOp.SUM).wait()
        if done is False or self.manager.errored() is not None:
            return None
        return [float(v) for v in tensor.tolist()]

    def _agree(self) -> None:
        """Average the groups' step and sync times; every group takes the same H."""
        step_s = statistics.median(self._step_times) if self._step_times else None
        sync_s = self.sync_seconds
        total = self._exchange(
            [step_s or 0.0, float(step_s is not None), sync_s or 0.0, float(sync_s is not None)]
        )
        if total is None or total[1] < 1 or total[3] < 1:
            return  # not measured yet (or the exchange failed): at the next sync
        step_avg, sync_avg = total[0] / total[1], total[2] / total[3]
        self.every = choose_every(sync_avg, step_avg)
        self.agreed = True
        self.chosen = {"step_s": step_avg, "sync_s": sync_avg}
        if self.group_rank == 0:
            print(
                f"corral: {self.mode} syncs every {self.every} steps (a sync's all-reduce "
                f"{sync_avg * 1000:.1f} ms, a local step {step_avg * 1000:.2f} ms, overhead "
                f"<= {OVERHEAD:.0%})",
                file=sys.stderr,
                flush=True,
            )

    # --- state -----------------------------------------------------------------------
    def schedule(self) -> dict[str, Any]:
        """What a healing group adopts: H, whether it is agreed, the steps kept."""
        return {"every": self.every, "agreed": self.agreed, "synced_steps": self.synced_steps}

    def load_schedule(self, state: Mapping[str, Any]) -> None:
        """Restore :meth:`schedule` (the local steps since the last sync start over)."""
        self.every, self.agreed = int(state["every"]), bool(state["agreed"])
        self.synced_steps = int(state["synced_steps"])
        self.algorithm._sync_every = self.every

    def state_dict(self) -> dict[str, Any]:
        """The schedule and, for DiLoCo, the shared weights and the outer optimizer."""
        state: dict[str, Any] = {"schedule": self.schedule()}
        if self.mode == "diloco":
            fragment = self.algorithm._fragments[0]
            state["shared"] = {
                name: t.detach().clone() for name, t in fragment.original_parameters.items()
            }
            state["outer_optimizer"] = self.outer_optimizer.state_dict()
        return state

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore :meth:`state_dict` (from a disk checkpoint)."""
        self.load_schedule(state["schedule"])
        if self.mode == "diloco":
            fragment = self.algorithm._fragments[0]
            for name, tensor in state["shared"].items():
                fragment.original_parameters[name].copy_(tensor)
            self.outer_optimizer.load_state_dict(state["outer_optimizer"])
        self.algorithm._local_step = 0

    def digests(self) -> tuple[list[str], list[int]]:
        """What must be equal across the groups at a sync's start, and its digests."""
        names, values = ["schedule"], [digest(self.schedule())]
        if self.mode == "diloco":
            fragment = self.algorithm._fragments[0]
            names += ["model", "optimizer"]
            values += [
                digest(fragment.original_parameters),
                digest(self.outer_optimizer.state_dict()),
            ]
        names += list(self.carried.objects)
        values += [digest(obj.state_dict()) for obj in self.carried.objects.values()]
        return names, values
