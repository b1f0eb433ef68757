"""The server and its clients find corral's own files in one place."""

from __future__ import annotations

from pathlib import Path

import pytest

from corral.client.token import read_token
from corral.paths import data_dir, default_token_file, token_path
from corral.store.db import default_db_url


def test_the_token_and_the_database_share_the_data_dir(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path))
    assert default_token_file() == tmp_path / "corral" / "token"
    assert default_db_url() == f"sqlite:///{tmp_path / 'corral' / 'corral.db'}"


def test_a_relative_xdg_data_home_is_ignored_for_both(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setenv("XDG_DATA_HOME", "relative/dir")
    assert data_dir() == tmp_path / ".local" / "share" / "corral"
    assert default_db_url() == f"sqlite:///{data_dir() / 'corral.db'}"


def test_a_client_reads_the_token_where_the_server_keeps_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path))
    monkeypatch.delenv("CORRAL_TOKEN", raising=False)
    default_token_file().parent.mkdir(parents=True)
    default_token_file().write_text("t0k3n\n")
    assert read_token(None) == "t0k3n"
    assert token_path("~/x") == Path("~/x").expanduser()
