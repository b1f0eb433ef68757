"""Byzantine-robust gradient aggregation for DDP: Krum and multi-Krum.

```python
ddp = DistributedDataParallel(model)
ddp.register_comm_hook(None, sdk.krum_hook(f=1))   # state: a process group or None
```

Instead of averaging every rank's gradient (one corrupted rank can then move
the model anywhere), each gradient bucket is all-gathered and every rank's
vector is scored by the sum of squared distances to its ``n - f - 2``
nearest neighbours; the ``m`` lowest-scored vectors are averaged (``m=1``:
Krum, Blanchard et al., NeurIPS 2017; ``m>1``: multi-Krum). This tolerates up
to ``f`` arbitrary ranks when ``n >= 2f + 3``. Every rank computes the same
selection from the same gathered vectors, so the replicas stay identical.
Cost: an all-gather (``n`` times an all-reduce's volume) and an ``n x n``
distance matrix per bucket.
"""

from __future__ import annotations

import inspect
from typing import Any

__all__ = ["KrumHook", "check_krum", "krum_aggregate", "krum_hook", "krum_select"]


_PARAMS = ("state", "bucket")


def _torch() -> Any:
    try:
        import torch
    except ImportError as exc:
        raise ImportError("krum_hook needs torch: pip install torch") from exc
    return torch


def check_krum(n: int, f: int, m: int | None = None) -> int:
    """Validate Krum's parameters for ``n`` ranks; the number of vectors averaged."""
    if isinstance(f, bool) or not isinstance(f, int) or f < 0:
        raise ValueError(f"f (ranks to tolerate) must be an integer >= 0, got {f!r}")
    if n < 2 * f + 3:
        raise ValueError(
            f"Krum with f={f} needs at least 2f+3 = {2 * f + 3} ranks; the job has {n}"
        )
    chosen = 1 if m is None else m
    if isinstance(chosen, bool) or not isinstance(chosen, int) or not 1 <= chosen <= n - f:
        raise ValueError(f"m (vectors averaged) must be between 1 and n-f = {n - f}, got {m!r}")
    return chosen


def krum_select(vectors: Any, f: int, m: int | None = None) -> list[int]:
    """Indices (rows of the ``n x d`` tensor ``vectors``) of the ``m`` lowest Krum scores,
    best first; ties go to the lower index. Non-finite rows score worst."""
    torch = _torch()
    n = int(vectors.shape[0])
    chosen = check_krum(n, f, m)
    x = vectors.detach().reshape(n, -1).to(torch.float64)
    finite = torch.isfinite(x).all(dim=1)
    x = torch.where(finite[:, None], x, torch.zeros_like(x))
    squares = (x * x).sum(dim=1)
    distances = (squares[:, None] + squares[None, :] - 2.0 * (x @ x.T)).clamp_min(0.0)
    bad = ~finite[:, None] | ~finite[None, :]
    distances = distances.masked_fill(bad, float("inf"))
    distances.fill_diagonal_(float("inf"))  # a vector is not its own neighbour
    nearest = torch.sort(distances, dim=1).values[:, : n - f - 2]
    scores = nearest.sum(dim=1).masked_fill(~finite, float("inf"))
    order = torch.sort(scores, stable=True).indices
    return [int(i) for i in order[:chosen]]


def krum_aggregate(vectors: Any, f: int, m: int | None = None) -> Any:
    """The mean of the rows :func:`krum_select` picks."""
    return vectors[krum_select(vectors, f, m)].mean(dim=0)


class KrumHook:
    """A DDP communication hook (see :func:`krum_hook`). ``selected`` counts, per rank,
    how often its gradient was among those averaged (a rank never picked is suspect)."""

    def __init__(self, f: int = 1, m: int | None = None) -> None:
        check_krum(2 * f + 3, f, None)  # f itself; n and m are checked against the group
        self.f, self.m = f, m
        self.selected: list[int] = []
        # DDP reads a hook's __name__, and refuses annotations that are not torch's own
        # classes (ours are strings, torch being optional): show it an unannotated one
        self.__name__ = self.__qualname__ = "krum_hook"
        self.__signature__ = inspect.Signature(
            [inspect.Parameter(name, inspect.Parameter.POSITIONAL_OR_KEYWORD) for name in _PARAMS]
        )
        dist = _torch().distributed
        if dist.is_available() and dist.is_initialized():
            check_krum(dist.get_world_size(), f, m)

    def __call__(self, state: Any, bucket: Any) -> Any:
        torch = _torch()
        dist = torch.distributed
        group = state  # a process group, or None for the default one
        n = dist.get_world_size(group)
        check_krum(n, self.f, self.m)
        if len(self.selected) != n:
            self.selected = [0] * n
        tensor = bucket.buffer()
        gathered = [torch.empty_like(tensor) for _ in range(n)]
        work = dist.all_gather(gathered, tensor, group=group, async_op=True)

        def aggregate(_: Any) -> Any:
            stacked = torch.stack(gathered)
            picked = krum_select(stacked, self.f, self.m)
            for rank in picked:
                self.selected[rank] += 1
            return stacked[picked].mean(dim=0).to(tensor.dtype)

        return work.get_future().then(aggregate)


def krum_hook(f: int = 1, m: int | None = None) -> KrumHook:
    """A Krum (``m=1``) or multi-Krum (``m`` > 1) DDP communication hook tolerating
    ``f`` Byzantine ranks; register with ``ddp.register_comm_hook(group_or_None, hook)``.

    Needs ``n >= 2f + 3`` ranks and ``1 <= m <= n - f`` (ValueError with the
    numbers, at once when the process group is up, else at the first step).
    """
    return KrumHook(f, m)
