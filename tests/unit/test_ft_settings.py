"""sdk.fault_tolerant's settings: a clear error for each missing or bad one."""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest

from corral import sdk
from corral.contract import (
    LIGHTHOUSE_ENV,
    REPLICA_GROUP_ENV,
    REPLICA_GROUPS_ENV,
    WORKLOAD_WEIGHTS_ENV,
)
from tests.conftest import require

pytestmark = pytest.mark.torch


def _parts() -> tuple[object, object]:
    torch = require("torch")
    model = torch.nn.Linear(2, 2)
    return model, torch.optim.SGD(model.parameters(), lr=0.1)


def test_missing_torchft_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "torchft", None)  # import torchft -> ImportError
    with pytest.raises(ImportError, match=r"pip install 'corral\[ft\]'"):
        sdk.fault_tolerant(*_parts(), env={})


@pytest.mark.parametrize(
    ("env", "match"),
    [
        ({LIGHTHOUSE_ENV: "http://127.0.0.1:1"}, f"set {REPLICA_GROUP_ENV}"),
        ({REPLICA_GROUP_ENV: "0"}, f"no Lighthouse: set {LIGHTHOUSE_ENV}"),
        ({REPLICA_GROUP_ENV: "x", LIGHTHOUSE_ENV: "h"}, f"{REPLICA_GROUP_ENV}='x' is not an"),
        (
            {REPLICA_GROUP_ENV: "3", REPLICA_GROUPS_ENV: "3", LIGHTHOUSE_ENV: "h"},
            "replica group 3 is outside 0..2",
        ),
        (
            {REPLICA_GROUP_ENV: "0", LIGHTHOUSE_ENV: "h", WORKLOAD_WEIGHTS_ENV: "1,2"},
            f"need the number of replica groups: set {REPLICA_GROUPS_ENV}",
        ),
        (
            {
                REPLICA_GROUP_ENV: "0",
                REPLICA_GROUPS_ENV: "3",
                LIGHTHOUSE_ENV: "h",
                WORKLOAD_WEIGHTS_ENV: "1,2",
            },
            "2 weights for 3 replica groups",
        ),
        (
            {REPLICA_GROUP_ENV: "0", LIGHTHOUSE_ENV: "h", "TORCHFT_TIMEOUT_SEC": "2.5"},
            "TORCHFT_TIMEOUT_SEC='2.5' is not an integer",
        ),
        (
            {REPLICA_GROUP_ENV: "0", LIGHTHOUSE_ENV: "h", "TORCHFT_QUORUM_TIMEOUT_SEC": "0"},
            "TORCHFT_QUORUM_TIMEOUT_SEC=0 must be at least 1 second",
        ),
    ],
)
def test_bad_settings_are_named(env: dict[str, str], match: str) -> None:
    require("torchft", "install the [ft] extra: make setup")
    with pytest.raises(ValueError, match=match):
        sdk.fault_tolerant(*_parts(), env=env)


@contextlib.contextmanager
def _one_group(monkeypatch: pytest.MonkeyPatch, **kwargs: Any) -> Iterator[Any]:
    """``sdk.fault_tolerant`` for replica group 0 of one rank, on a real Lighthouse and
    store in this process (``kwargs``: more env, and its arguments ``timeout`` ...)."""
    monkeypatch.setenv("RUST_LOG", "warn")
    require("torchft", "install the [ft] extra: make setup")
    import torch.distributed as dist
    from torchft.coordination import LighthouseServer

    lighthouse = LighthouseServer(bind="[::]:0", min_replicas=1)
    store = dist.TCPStore("127.0.0.1", 0, 1, True, wait_for_workers=False)  # type: ignore[attr-defined]
    env = {
        LIGHTHOUSE_ENV: lighthouse.address(),
        REPLICA_GROUP_ENV: "0",
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(store.port),
        "RANK": "0",
        "WORLD_SIZE": "1",
        **kwargs.pop("env", {}),
    }
    ft = sdk.fault_tolerant(*_parts(), env=env, **kwargs)
    try:
        yield ft
    finally:
        ft.shutdown()
        lighthouse.shutdown()


def test_peers_are_given_the_groups_address_not_the_hostname(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # the other groups dial this group's manager and (to heal) its checkpoint server at
    # what they advertise: the group's MASTER_ADDR, never socket.gethostname(), which
    # the peers may not resolve
    with _one_group(monkeypatch) as ft:
        assert ft.manager._manager.address().startswith("http://127.0.0.1:")
        assert ft.manager._checkpoint_transport.metadata().startswith("http://127.0.0.1:")


def test_torchft_timeout_sec_is_the_process_groups_timeout_too(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # torchft's Manager reads TORCHFT_TIMEOUT_SEC for its own waits only; the process
    # group (its gloo connect and collectives) and the checkpoint transport are built
    # by sdk.fault_tolerant, which gives them the same value (as the docs and the
    # pre-flight's timeouts check say), not its timeout= argument
    env = {"TORCHFT_TIMEOUT_SEC": "7", "TORCHFT_QUORUM_TIMEOUT_SEC": "41"}
    with _one_group(monkeypatch, env=env, timeout=300, quorum_timeout=600) as ft:
        assert (ft.timeout, ft.quorum_timeout) == (7.0, 41.0)
        assert ft.manager._pg._timeout == timedelta(seconds=7)
        assert ft.manager._timeout == timedelta(seconds=7)
        assert ft.manager._quorum_timeout == timedelta(seconds=41)
        assert ft.manager._checkpoint_transport._timeout == timedelta(seconds=7)
        # the Manager hands its quorums corral's ids (corral.sdk._ftids)
        assert type(ft.manager._client).__name__ == "_Client"
        assert type(ft.manager._pg).__name__ == "CorralProcessGroupGloo"
