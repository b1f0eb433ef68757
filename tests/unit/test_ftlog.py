"""torchft's logging in an in-place job's ranks: warnings by default, its quorum
changes shown, the flight recorder warning of CPU builds folded, everything with
CORRAL_TORCHFT_LOG=info (real loggers, the gate on a logger of the test's own)."""

from __future__ import annotations

import logging
from collections.abc import Iterator

import pytest

from corral.recovery.inplace import healing_source
from corral.sdk import _ftlog
from corral.sdk._ftlog import FOLD_NOTE, TorchftGate, quiet_torchft, torchft_level

FR = (
    "[corral_0:abc/0 - step 3] Unable to reset NCCL flight recorder recording so traces "
    "will be incorrect."
)


@pytest.fixture
def manager() -> Iterator[logging.Logger]:
    """A logger standing for torchft.manager, at INFO, with a handler of its own."""
    log = logging.getLogger("test-ftlog.manager")
    log.setLevel(logging.INFO)
    log.propagate = False
    yield log
    log.filters.clear()
    log.handlers.clear()


def _records(log: logging.Logger) -> list[str]:
    seen: list[str] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            seen.append(f"{record.levelname} {record.getMessage()}")

    log.addHandler(Keep())
    return seen


def _torchft_says(log: logging.Logger) -> None:
    log.info("[Replica corral_0] Start quorum for group_rank 0")
    log.info("[corral_0/0 - step 2] reconfiguring for quorum_id=2")
    log.warning(FR)
    log.info("[corral_0/0 - step 2] fetching checkpoint from recover_src_replica_rank=1 with x")
    log.warning(FR)
    log.warning("[corral_0/0 - step 4] should_commit failed")


def test_by_default_only_warnings_and_the_quorum_changes_are_shown(
    manager: logging.Logger, capsys: pytest.CaptureFixture[str]
) -> None:
    handled = _records(manager)
    gate = TorchftGate(torchft_level({}))
    manager.addFilter(gate)
    _torchft_says(manager)
    assert handled == ["WARNING [corral_0/0 - step 4] should_commit failed"]
    err = capsys.readouterr().err.splitlines()
    assert err == [
        "[torchft] [corral_0/0 - step 2] reconfiguring for quorum_id=2",
        FOLD_NOTE,  # once, for both
        "[torchft] [corral_0/0 - step 2] fetching checkpoint from recover_src_replica_rank=1 "
        "with x",
    ]
    assert gate.folded == 2
    assert healing_source("\n".join(err)) == 1  # what the supervisor reads


def test_with_corral_torchft_log_info_everything_is_shown(
    manager: logging.Logger, capsys: pytest.CaptureFixture[str]
) -> None:
    handled = _records(manager)
    gate = TorchftGate(torchft_level({"CORRAL_TORCHFT_LOG": "info"}))
    taps: list[str] = []
    gate.tap = lambda record: taps.append(record.getMessage())
    manager.addFilter(gate)
    _torchft_says(manager)
    assert len(handled) == 6 and handled[2] == f"WARNING {FR}"
    assert capsys.readouterr().err == ""  # the handlers print them, once
    assert len(taps) == 6  # the SDK's quorum events see every record


def test_without_a_handler_the_gate_prints_what_the_level_lets_through(
    manager: logging.Logger, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    # a script that configured no logging (pytest's own capture handler aside)
    monkeypatch.setattr(manager, "hasHandlers", lambda: False)
    manager.addFilter(TorchftGate(logging.INFO))
    manager.info("[Replica corral_0] Start quorum for group_rank 0")
    assert capsys.readouterr().err == "[torchft] [Replica corral_0] Start quorum for group_rank 0\n"


@pytest.mark.parametrize(
    ("env", "rust"),
    [
        ({}, "warn"),
        ({"CORRAL_TORCHFT_LOG": "info"}, "info"),
        ({"CORRAL_TORCHFT_LOG": "DEBUG"}, "debug"),
        ({"CORRAL_TORCHFT_LOG": "loud"}, "warn"),  # not a level: the default
        ({"CORRAL_TORCHFT_LOG": "info", "RUST_LOG": "torchft=trace"}, "torchft=trace"),
    ],
)
def test_the_rust_side_follows_unless_the_job_set_rust_log(
    env: dict[str, str], rust: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    installed = TorchftGate(logging.WARNING)
    monkeypatch.setattr(_ftlog, "_gate", installed)  # the process's gate stays untouched
    assert quiet_torchft(env) is installed
    assert env["RUST_LOG"] == rust


def test_the_healing_source_is_read_from_either_side_of_torchft() -> None:
    rust = "[Replica corral_2] healing is required step=0, max_step=71, recover_src_replica_rank=2"
    assert healing_source(rust) == 2
    assert healing_source("nothing here") is None
