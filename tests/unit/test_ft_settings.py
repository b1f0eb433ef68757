"""sdk.fault_tolerant's settings: a clear error for each missing or bad one."""

from __future__ import annotations

import sys

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
    ],
)
def test_bad_settings_are_named(env: dict[str, str], match: str) -> None:
    require("torchft", "install the [ft] extra: make setup")
    with pytest.raises(ValueError, match=match):
        sdk.fault_tolerant(*_parts(), env=env)


def test_peers_are_given_the_groups_address_not_the_hostname(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # the other groups dial this group's manager and (to heal) its checkpoint server at
    # what they advertise: the group's MASTER_ADDR, never socket.gethostname(), which
    # the peers may not resolve
    monkeypatch.setenv("RUST_LOG", "warn")
    require("torchft", "install the [ft] extra: make setup")
    import torch.distributed as dist
    from torchft.coordination import LighthouseServer

    lighthouse = LighthouseServer(bind="[::]:0", min_replicas=1)
    store = dist.TCPStore("127.0.0.1", 0, 1, True, wait_for_workers=False)
    env = {
        LIGHTHOUSE_ENV: lighthouse.address(),
        REPLICA_GROUP_ENV: "0",
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(store.port),
        "RANK": "0",
        "WORLD_SIZE": "1",
    }
    ft = sdk.fault_tolerant(*_parts(), env=env)
    try:
        assert ft.manager._manager.address().startswith("http://127.0.0.1:")
        assert ft.manager._checkpoint_transport.metadata().startswith("http://127.0.0.1:")
    finally:
        ft.shutdown()
        lighthouse.shutdown()
