"""The server's run dir is private: another local OS user cannot list its jobs."""

from __future__ import annotations

import stat
from pathlib import Path

from corral.api.services import Services
from corral.service.settings import ServerSettings
from corral.store import open_store


def test_the_servers_run_dir_and_its_missing_parents_are_private(tmp_path: Path) -> None:
    run_dir = tmp_path / "data" / "runs"
    store = open_store(f"sqlite:///{tmp_path / 'corral.db'}")
    try:
        Services.build(store, ServerSettings(run_dir=run_dir))
    finally:
        store.close()
    assert stat.S_IMODE(run_dir.stat().st_mode) == 0o700


def test_an_existing_open_run_dir_is_made_private(tmp_path: Path) -> None:
    run_dir = tmp_path / "runs"
    run_dir.mkdir(mode=0o755)
    run_dir.chmod(0o755)
    store = open_store(f"sqlite:///{tmp_path / 'corral.db'}")
    try:
        Services.build(store, ServerSettings(run_dir=run_dir))
    finally:
        store.close()
    assert stat.S_IMODE(run_dir.stat().st_mode) == 0o700
