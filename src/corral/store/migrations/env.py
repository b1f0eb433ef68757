"""Alembic environment of the store.

:func:`corral.store.db.open_store` runs the migrations programmatically and passes
its connection in ``config.attributes["connection"]``: no ``alembic.ini`` and no
logging setup. Without one (a developer running ``alembic`` by hand with
``-x url=...`` or ``sqlalchemy.url``), the URL names the database.
"""

from __future__ import annotations

from alembic import context
from sqlalchemy import Connection, create_engine

from corral.store.models import Base

config = context.config
target_metadata = Base.metadata


def _url() -> str:
    url = context.get_x_argument(as_dictionary=True).get("url") or config.get_main_option(
        "sqlalchemy.url"
    )
    if not url:
        raise RuntimeError("no database: pass -x url=... or set sqlalchemy.url")
    return url


def _run(connection: Connection) -> None:
    context.configure(
        connection=connection,
        target_metadata=target_metadata,
        render_as_batch=connection.dialect.name == "sqlite",
        compare_type=True,
    )
    with context.begin_transaction():
        context.run_migrations()


def run_offline() -> None:
    """Write the SQL of the migrations instead of running it (``alembic upgrade --sql``)."""
    context.configure(url=_url(), target_metadata=target_metadata, literal_binds=True)
    with context.begin_transaction():
        context.run_migrations()


def run_online() -> None:
    """Run the migrations on the given connection, or on one to the URL."""
    connection = config.attributes.get("connection")
    if connection is not None:
        _run(connection)
        return
    engine = create_engine(_url())
    try:
        with engine.connect() as own:
            _run(own)
            own.commit()
    finally:
        engine.dispose()


if context.is_offline_mode():
    run_offline()
else:
    run_online()
