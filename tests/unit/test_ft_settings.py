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
