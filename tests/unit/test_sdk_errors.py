"""corral.sdk error files and the @record decorator."""

from __future__ import annotations

import json
import os
import socket
import time
from pathlib import Path

import pytest

from corral import sdk
from tests.conftest import require_torch


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in (
        "CORRAL_ERROR_FILE",
        "TORCHELASTIC_ERROR_FILE",
        "RANK",
        "LOCAL_RANK",
        "WORLD_SIZE",
    ):
        monkeypatch.delenv(name, raising=False)


def boom() -> None:
    raise ValueError("learning rate exploded")


def caught() -> BaseException:
    try:
        boom()
    except ValueError as exc:
        return exc
    raise AssertionError("unreachable")


def test_write_and_read_roundtrip(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("RANK", "3")
    monkeypatch.setenv("LOCAL_RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "4")
    target = tmp_path / "deep" / "err.json"
    before = time.time()
    assert sdk.write_error_file(caught(), target) == target
    data = sdk.read_error_file(target)
    assert data is not None
    assert set(data) == {
        "rank", "local_rank", "host", "pid", "timestamp", "exc_type", "message", "traceback",
    }  # fmt: skip
    assert (data["rank"], data["local_rank"]) == (3, 1)
    assert data["host"] == socket.gethostname()
    assert data["pid"] == os.getpid()
    assert before <= data["timestamp"] <= time.time()
    assert data["exc_type"] == "ValueError"
    assert data["message"] == "learning rate exploded"
    assert "in boom" in data["traceback"]
    assert "ValueError: learning rate exploded" in data["traceback"]
    assert [p.name for p in target.parent.iterdir()] == ["err.json"]  # no temp left behind


def test_destination_from_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    elastic = tmp_path / "elastic.json"
    monkeypatch.setenv("TORCHELASTIC_ERROR_FILE", str(elastic))
    assert sdk.write_error_file(caught()) == elastic
    corral_file = tmp_path / "corral.json"
    monkeypatch.setenv("CORRAL_ERROR_FILE", str(corral_file))  # wins over torchrun's
    elastic.unlink()
    assert sdk.write_error_file(caught()) == corral_file
    assert corral_file.exists()
    assert not elastic.exists()


def test_no_destination_is_a_noop(tmp_path: Path) -> None:
    assert sdk.error_file_path() is None
    assert sdk.write_error_file(caught()) is None


def test_overwrites_atomically(tmp_path: Path) -> None:
    target = tmp_path / "err.json"
    target.write_text("old")
    sdk.write_error_file(RuntimeError("second"), target)
    assert json.loads(target.read_text())["message"] == "second"


def test_unwritable_destination_does_not_raise(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    assert sdk.write_error_file(caught(), blocker / "err.json") is None
    assert "could not write error file" in capsys.readouterr().err


def test_custom_exception_type_is_qualified(tmp_path: Path) -> None:
    class DataError(Exception):
        pass

    target = tmp_path / "e.json"
    sdk.write_error_file(DataError(), target)
    data = sdk.read_error_file(target)
    assert data is not None
    assert data["exc_type"].endswith("DataError")
    assert data["exc_type"].startswith(__name__)
    assert data["message"] == data["exc_type"]  # empty message: the type stands in


@pytest.mark.parametrize("content", [None, "", "{not json", "[1, 2]"])
def test_read_error_file_bad_input(tmp_path: Path, content: str | None) -> None:
    target = tmp_path / "e.json"
    if content is not None:
        target.write_text(content)
    assert sdk.read_error_file(target) is None


def test_record_writes_and_reraises(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    target = tmp_path / "e.json"
    monkeypatch.setenv("CORRAL_ERROR_FILE", str(target))

    @sdk.record
    def main(x: int) -> int:
        if x:
            raise KeyError("missing shard")
        return 42

    assert main(0) == 42
    assert not target.exists()
    assert main.__name__ == "main"
    with pytest.raises(KeyError, match="missing shard"):
        main(1)
    data = sdk.read_error_file(target)
    assert data is not None
    assert data["exc_type"] == "KeyError"
    assert "missing shard" in data["message"]


@pytest.mark.parametrize(("code", "written"), [(0, False), (None, False), (3, True), ("bad", True)])
def test_record_system_exit(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, code: int | str | None, written: bool
) -> None:
    target = tmp_path / "e.json"
    monkeypatch.setenv("CORRAL_ERROR_FILE", str(target))

    @sdk.record
    def main() -> None:
        raise SystemExit(code)

    with pytest.raises(SystemExit) as info:
        main()
    assert info.value.code == code  # re-raised as it was
    assert target.exists() is written
    if written:
        data = sdk.read_error_file(target)
        assert data is not None
        assert data["exc_type"] == "SystemExit"
        assert str(code) in data["message"]


def test_record_ignores_keyboard_interrupt(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    target = tmp_path / "e.json"
    monkeypatch.setenv("CORRAL_ERROR_FILE", str(target))

    @sdk.record
    def main() -> None:
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        main()
    assert not target.exists()


@pytest.mark.torch
def test_torchrun_reads_our_error_file(tmp_path: Path) -> None:
    """torchrun's failure summary shows our message (it reads "message" and "timestamp")."""
    require_torch()
    from torch.distributed.elastic.multiprocessing.errors import ProcessFailure

    target = tmp_path / "e.json"
    sdk.write_error_file(caught(), target)
    # A timestamp far from now: torchrun must take ours, not its fallback (the time it
    # reads the file).
    data = json.loads(target.read_text())
    data["timestamp"] = 1_000_000_000.75
    target.write_text(json.dumps(data))
    failure = ProcessFailure(local_rank=0, pid=1, exitcode=1, error_file=str(target))
    assert failure.message == "learning rate exploded"
    assert failure.timestamp == 1_000_000_000
