"""Fixtures of the end-to-end tests: a throwaway PostgreSQL server, store URLs."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests import pgserver


@pytest.fixture(scope="session")
def postgres_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """URL of ``corral_test`` on a PostgreSQL server started for this test session (its
    data dir copied from the first one's in the run's temp root, which every
    pytest-xdist worker of the run shares)."""
    with pgserver.postgres_or_skip(tmp_path_factory.getbasetemp().parent) as url:
        yield url


@pytest.fixture(params=["sqlite", "postgresql"])
def store_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """An empty database: a SQLite file in ``tmp_path``, or a fresh PostgreSQL database."""
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'corral.db'}"
        return
    server: str = request.getfixturevalue("postgres_url")
    name = f"corral_{uuid.uuid4().hex[:12]}"
    url = pgserver.create_database(server, name)
    try:
        yield url
    finally:
        pgserver.drop_database(server, name)
