"""Coordinator-level chunking (seed phase 4.5): a big dataset in resumable chunks.

```python
for chunk in sdk.chunks(len(dataset), checkpoint_dir="ckpts"):
    train_on(Subset(dataset, chunk.range))   # save your model checkpoint here too
```

Between chunks memory is freed (``gc.collect()``, then the torch CUDA/MPS
caching allocators and MLX's cache when those are in use) and the chunk is
recorded as done in ``<checkpoint_dir>/<name>.json`` (written atomically by
every rank, in its own checkpoint directory). A rerun starts at the first
unfinished chunk; when a process group is up, all ranks start at the lowest
chunk any of them has not finished. A chunk whose body was interrupted is
done again, so save the model at the end of each chunk's body.
"""

from __future__ import annotations

import contextlib
import gc
import json
import os
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from corral.contract import CHECKPOINT_DIR_ENV, fsync_dir
from corral.sdk._env import info
from corral.sdk._paths import job_path
from corral.sdk._report import send_event
from corral.sdk._resume import _group

__all__ = ["CHUNK_SIZE", "Chunk", "chunks", "free_memory"]

CHUNK_SIZE = 50_000


@dataclass(frozen=True)
class Chunk:
    """Examples ``start`` (inclusive) to ``stop`` (exclusive), chunk ``index`` (0-based)
    of ``total``. ``chunked`` is False for the single chunk of a dataset below the threshold."""

    index: int
    total: int
    start: int
    stop: int
    chunked: bool = True

    @property
    def range(self) -> range:
        """The example indices of this chunk."""
        return range(self.start, self.stop)

    def __len__(self) -> int:
        return self.stop - self.start


def free_memory() -> None:
    """Collect garbage and empty the torch CUDA/MPS and MLX caches when those are in use."""
    gc.collect()
    torch: Any = sys.modules.get("torch")
    if torch is not None:
        if torch.cuda.is_available() and torch.cuda.is_initialized():
            torch.cuda.empty_cache()
        mps = getattr(torch.backends, "mps", None)
        if mps is not None and mps.is_available():
            torch.mps.empty_cache()
    mx: Any = sys.modules.get("mlx.core")
    if mx is not None and hasattr(mx, "clear_cache"):
        mx.clear_cache()


def _positive(name: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ValueError(f"{name} must be a positive integer, got {value!r}")
    return value


def _percent(done: int, total: int) -> int:
    """``done`` of ``total`` in whole percent, rounded half up (2 of 3: 67); 100 only
    once every chunk is done."""
    rounded = (200 * done + total) // (2 * total)
    return rounded if done >= total else min(rounded, 99)


def _say(line: str) -> None:
    if info().rank == 0:
        print(f"[corral] {line}", flush=True)


def _state_path(checkpoint_dir: str | os.PathLike[str] | None, name: str) -> Path | None:
    if not name or "/" in name or name.startswith("."):
        raise ValueError(f"chunk state name {name!r} must be a plain file name")
    folder = checkpoint_dir or os.environ.get(CHECKPOINT_DIR_ENV, "").strip()
    return job_path(folder) / f"{name}.json" if folder else None


def _read_done(path: Path | None, expected: dict[str, int]) -> tuple[int, str | None]:
    """(chunks done, error or None) from the state file at ``path``."""
    if path is None:
        return 0, None
    try:
        state = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return 0, None
    except (OSError, ValueError) as exc:
        return 0, f"cannot read chunk state {path}: {exc}"
    if not isinstance(state, dict) or not isinstance(state.get("done"), int):
        return 0, f"chunk state {path} is not a chunk state file"
    recorded = {k: state.get(k) for k in expected}
    if recorded != expected:
        return 0, (
            f"chunk state {path} records {recorded}, this run has {expected}: "
            "delete it or pass another name= to start over"
        )
    return max(0, min(state["done"], expected["total"])), None


def _agree(done: int, error: str | None) -> int:
    """The lowest ``done`` over the ranks (raising every rank's errors on every rank)."""
    dist = _group()
    facts = [(done, error)]
    if dist is not None:
        facts = [(0, None)] * dist.get_world_size()
        dist.all_gather_object(facts, (done, error))
    errors = [f"rank {r}: {e}" for r, (_, e) in enumerate(facts) if e]
    if errors:
        raise ValueError("; ".join(errors))
    return min(d for d, _ in facts)


def _record(path: Path, state: dict[str, int]) -> None:
    """Write ``state`` to ``path`` atomically (temp file, fsync, rename, fsync dir)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            json.dump(state, fh)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    fsync_dir(path.parent)


def chunks(
    n_examples: int,
    chunk_size: int = CHUNK_SIZE,
    *,
    checkpoint_dir: str | os.PathLike[str] | None = None,
    name: str = "chunks",
) -> Iterator[Chunk]:
    """Yield the chunks of ``n_examples`` that are not done yet, recording each as done.

    The seed's rule, exactly: "Dataset == 50,000 → Enable chunking (>=
    threshold); Dataset == 49,999 → Disable chunking (< threshold); Dataset <=
    0 → Raise ValueError (invalid)", with ``num_chunks = ceil(n / chunk_size)``.
    So 50,000 examples run chunked as one chunk of 50,000 (progress line, memory
    freed and completion recorded after it), 49,999 as one unchunked
    :class:`Chunk` (``chunked=False``: no progress, freeing or state file), and
    100,001 as three chunks.

    Progress ("chunk k/N (p%)") is printed on rank 0 and sent to the supervisor
    as a ``{"type": "chunk"}`` event. ``checkpoint_dir`` defaults to
    ``$CORRAL_CHECKPOINT_DIR``; without either nothing is recorded and a rerun
    starts over. Use a different ``name`` for each pass over the data (e.g. per
    epoch), since a finished pass yields nothing when run again.
    """
    n = _positive("n_examples", n_examples)
    size = _positive("chunk_size", chunk_size)
    if n < size:
        _say(f"dataset below the chunking threshold ({n:,} < {size:,} examples): chunking disabled")
        yield Chunk(0, 1, 0, n, chunked=False)
        return
    total = -(-n // size)
    path = _state_path(checkpoint_dir, name)
    expected = {"n_examples": n, "chunk_size": size, "total": total}
    done = _agree(*_read_done(path, expected))
    _say(f"chunking enabled: {total} chunks of {size:,} examples")
    if done >= total:
        _say(
            f"all {total} chunks already done ({path}): nothing to do (delete it or pass "
            "another name= to start over)"
        )
    elif done:
        first = "chunk 1" if done == 1 else f"chunks 1-{done}"
        _say(f"{first} of {total} already done ({path}); resuming at chunk {done + 1}")
    for index in range(done, total):
        start = index * size
        chunk = Chunk(index, total, start, min(start + size, n))
        _say(f"chunk {index + 1}/{total}: examples {chunk.start:,}-{chunk.stop - 1:,}")
        yield chunk
        free_memory()
        if path is not None:
            _record(path, {**expected, "done": index + 1})
        percent = _percent(index + 1, total)
        _say(f"chunk {index + 1}/{total} ({percent}%) done")
        if info().rank == 0:
            send_event({"type": "chunk", "chunk": index + 1, "total": total, "percent": percent})
