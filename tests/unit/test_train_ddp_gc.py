"""examples/train_ddp.py keeps Python's full garbage collections short (issue 33
item 6): the loader's per-example tuples set off a full collection every few steps,
and one that walks torch's ~280k long-lived objects stalled every rank of the
heterogeneous benchmark at the next all-reduce (0.3-0.9 s, 4-9 times in 59 steps)."""

from __future__ import annotations

import gc
import importlib.util
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest

from tests.conftest import require_torch

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "train_ddp.py"


@pytest.fixture
def example() -> Iterator[ModuleType]:
    require_torch()
    spec = importlib.util.spec_from_file_location("train_ddp_gc", EXAMPLE)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    try:
        yield module
    finally:
        sys.modules.pop(spec.name, None)
        gc.unfreeze()


def test_full_collections_in_the_loop_walk_no_long_lived_objects(
    example: ModuleType, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    for name in ("WORLD_SIZE", "RANK", "CORRAL_CONTROL", "CORRAL_WORKLOAD_WEIGHTS"):
        monkeypatch.delenv(name, raising=False)
    gc.unfreeze()
    full: list[int] = []  # objects a full collection had to walk

    def on_gc(phase: str, info: dict[str, int]) -> None:
        if phase == "start" and info["generation"] == 2:
            full.append(len(gc.get_objects(generation=2)))

    gc.callbacks.append(on_gc)
    try:
        example.main(["--steps", "4", "--checkpoint-every", "0", "--batch-size", "64"])
        gc.collect()  # the full collection the loop would reach after a few steps
    finally:
        gc.callbacks.remove(on_gc)
    assert "final loss" in capsys.readouterr().out
    assert gc.get_freeze_count() > 10_000  # torch's objects, frozen before the loop
    assert full and full[-1] < gc.get_freeze_count() / 10
