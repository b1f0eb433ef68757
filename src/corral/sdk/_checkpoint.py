"""Atomic, self-verifying checkpoints.

``save_checkpoint`` writes ``ckpt-{step:08d}.pt`` (``ckpt-{step:08d}-rank{rank:05d}.pt``
with ``all_ranks``) through a hidden temp file in the same directory: write,
flush, ``fsync``, ``os.replace``, ``fsync`` the directory. A crash therefore
leaves at worst a ``.ckpt-*.tmp-*`` file, which is never a candidate and is
removed by the next save.

``latest_checkpoint`` also guards against files damaged some other way (a
partial copy, a non-atomic network filesystem, a torn page after power loss):
``torch.save`` writes a zip archive whose directory is at the end of the file,
so each candidate, newest first, is accepted only if that directory parses,
names a ``data.pkl`` and every entry lies within the file. This costs a few
small reads (no tensor data is read) and needs no torch; a truncated or
zero-tailed file fails it, and the next older checkpoint is used instead.
"""

from __future__ import annotations

import os
import re
import struct
import sys
import zipfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from corral.sdk._env import info

__all__ = ["is_complete_checkpoint", "latest_checkpoint", "load_checkpoint", "save_checkpoint"]

_NAME = re.compile(r"ckpt-(\d+)(?:-rank(\d+))?\.pt")
_LOCAL_HEADER = b"PK\x03\x04"


def _torch() -> Any:
    try:
        import torch
    except ImportError as exc:
        raise ImportError("corral checkpoints need torch: pip install 'corral[torch]'") from exc
    return torch


def _filename(step: int, rank: int | None) -> str:
    return f"ckpt-{step:08d}.pt" if rank is None else f"ckpt-{step:08d}-rank{rank:05d}.pt"


def _checkpoints(directory: Path, rank: int | None) -> list[tuple[int, Path]]:
    """(step, path) of every checkpoint-named file of this rank family, oldest first."""
    found: list[tuple[int, Path]] = []
    try:
        entries = list(os.scandir(directory))
    except (FileNotFoundError, NotADirectoryError):
        return found
    for entry in entries:
        m = _NAME.fullmatch(entry.name)
        if m is None:
            continue
        file_rank = None if m.group(2) is None else int(m.group(2))
        if file_rank == rank and entry.is_file():
            found.append((int(m.group(1)), Path(entry.path)))
    found.sort()
    return found


def _fsync_dir(directory: Path) -> None:
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass  # some filesystems refuse fsync on a directory
    finally:
        os.close(fd)


def save_checkpoint(
    state: Mapping[str, Any],
    directory: str | os.PathLike[str],
    step: int,
    *,
    keep: int | None = 3,
    all_ranks: bool = False,
) -> Path | None:
    """Atomically save ``state`` as step ``step``; return its path (None on ranks that skip).

    Only global rank 0 writes unless ``all_ranks`` (then every rank writes its
    own ``-rankNNNNN`` file). Afterwards the newest ``keep`` checkpoints of this
    family with a step <= ``step`` are kept and older ones deleted (``keep=None``
    keeps everything); files with a higher step are left alone. No collective
    is called, so ranks never wait on each other here.
    """
    if step < 0:
        raise ValueError(f"step must be >= 0, got {step}")
    if keep is not None and keep < 1:
        raise ValueError(f"keep must be >= 1 or None, got {keep}")
    torch = _torch()
    me = info()
    if not all_ranks and me.rank != 0:
        return None
    rank = me.rank if all_ranks else None
    folder = Path(directory)
    folder.mkdir(parents=True, exist_ok=True)
    final = folder / _filename(step, rank)
    tmp = folder / f".{final.name}.tmp-{os.getpid()}"
    try:
        with open(tmp, "wb") as fh:
            torch.save(dict(state), fh)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, final)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    _fsync_dir(folder)
    _prune(folder, rank, step, keep)
    return final


def _prune(folder: Path, rank: int | None, step: int, keep: int | None) -> None:
    suffix = _filename(0, rank)[len("ckpt-00000000") :]
    for leftover in folder.glob(f".ckpt-*{suffix}.tmp-*"):
        leftover.unlink(missing_ok=True)
    if keep is None:
        return
    older = [path for s, path in _checkpoints(folder, rank) if s <= step]
    for path in older[: max(0, len(older) - keep)]:
        try:
            path.unlink()
        except OSError as err:
            print(f"[corral] could not prune {path}: {err}", file=sys.stderr, flush=True)


def is_complete_checkpoint(path: str | os.PathLike[str]) -> bool:
    """Cheap structural check that ``path`` is a whole ``torch.save`` archive."""
    try:
        size = os.path.getsize(path)
        with open(path, "rb") as fh, zipfile.ZipFile(fh) as archive:
            entries = archive.infolist()
            if not any(e.filename.endswith("data.pkl") for e in entries):
                return False
            last = max(entries, key=lambda e: e.header_offset)
            if any(e.header_offset + e.compress_size > size for e in entries):
                return False
            fh.seek(last.header_offset)
            header = fh.read(30)
            if len(header) < 30 or header[:4] != _LOCAL_HEADER:
                return False
            name_len, extra_len = struct.unpack("<HH", header[26:30])
            end = last.header_offset + 30 + int(name_len) + int(extra_len) + last.compress_size
            return end <= size
    except (OSError, zipfile.BadZipFile, ValueError, EOFError, struct.error):
        return False


def latest_checkpoint(directory: str | os.PathLike[str], *, rank: int | None = None) -> Path | None:
    """The newest complete checkpoint in ``directory``, or None.

    ``rank=None`` looks at rank-0 checkpoints (``ckpt-N.pt``); an integer looks
    at that rank's ``all_ranks`` files. Temp files are ignored and damaged files
    skipped (see the module docstring). With ``all_ranks`` checkpoints, ranks
    should agree on a step (e.g. an ``all_reduce`` MIN) before loading.
    """
    for _, path in reversed(_checkpoints(Path(directory), rank)):
        if is_complete_checkpoint(path):
            return path
    return None


def load_checkpoint(
    path: str | os.PathLike[str], map_location: Any = "cpu", *, weights_only: bool = True
) -> dict[str, Any]:
    """Load a checkpoint written by :func:`save_checkpoint` (tensors mapped to ``map_location``)."""
    torch = _torch()
    state = torch.load(path, map_location=map_location, weights_only=weights_only)
    if not isinstance(state, dict):
        raise TypeError(f"{path} does not hold a dict (got {type(state).__name__})")
    return state
