"""The Lighthouse child (``--recovery in-place``) serves torchft's Rust server without
importing torch: ``import torchft`` runs the package's ``__init__`` (torch, the
Manager: ~1.8 CPU-s at every in-place job's start) for a server that needs none of it."""

from __future__ import annotations

import asyncio
import sys
from datetime import timedelta
from pathlib import Path

import pytest

from corral.recovery.lighthouse import Lighthouse
from tests.conftest import require


def test_the_lighthouse_child_serves_quorums_without_loading_torch(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("RUST_LOG", "warn")
    require("torchft", "install the [ft] extra: make setup")
    loop = asyncio.new_event_loop()
    child = loop.run_until_complete(Lighthouse.start(sys.executable, "127.0.0.1", 1))
    try:
        maps = Path(f"/proc/{child.proc.pid}/maps").read_text()
        assert "_torchft" in maps  # the server's native extension is what runs
        assert "libtorch" not in maps and "torch/lib" not in maps, "the child loaded torch"
        from torchft.coordination import LighthouseClient  # here: the test's own process

        quorum = LighthouseClient(child.url, connect_timeout=timedelta(seconds=30)).quorum(
            replica_id="g0", timeout=timedelta(seconds=30)
        )
        assert [m.replica_id for m in quorum.participants] == ["g0"]
    finally:
        loop.run_until_complete(child.close())
        loop.close()
