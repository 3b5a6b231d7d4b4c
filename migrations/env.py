"""Alembic environment: the URL comes from Flightdeck's settings unless the caller set one."""

from __future__ import annotations

from alembic import context
from sqlalchemy import text

from controlplane.config import load_settings
from controlplane.db import make_engine
from controlplane.models import Base

config = context.config
MIGRATION_LOCK = 0x466C6967687464  # "Flightd": the advisory lock key every Flightdeck migration takes on PostgreSQL
target_metadata = Base.metadata


def _url() -> str:
    return config.get_main_option("sqlalchemy.url") or load_settings().sqlalchemy_url


def run_migrations_offline() -> None:
    context.configure(url=_url(), target_metadata=target_metadata, render_as_batch=True, literal_binds=True)
    with context.begin_transaction():
        context.run_migrations()


def run_migrations_online() -> None:
    engine = make_engine(_url())
    with engine.connect() as connection:
        postgres = connection.dialect.name == "postgresql"
        if postgres:
            # NOTE: several nodes starting at once on an empty database: one migrates, the others wait here for
            # it (a session-level advisory lock, released below or with the connection), then find the schema at
            # head and do nothing. SQLite is one node: its file lock serialises writers already.
            connection.execute(text("SELECT pg_advisory_lock(:key)"), {"key": MIGRATION_LOCK})
            connection.commit()
        try:
            # NOTE: batch mode, because SQLite can only ALTER a table by copying it.
            context.configure(connection=connection, target_metadata=target_metadata, render_as_batch=True)
            with context.begin_transaction():
                context.run_migrations()
        finally:
            if postgres:
                connection.rollback()  # NOTE: a failed migration leaves the transaction aborted; unlock needs a live one
                connection.execute(text("SELECT pg_advisory_unlock(:key)"), {"key": MIGRATION_LOCK})
                connection.commit()
    engine.dispose()


if context.is_offline_mode():
    run_migrations_offline()
else:
    run_migrations_online()
