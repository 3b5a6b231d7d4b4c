"""The runbook_runs migration creates exactly what the model declares."""

from __future__ import annotations

import importlib.util
from pathlib import Path

from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from alembic.operations import Operations
from sqlalchemy import inspect

from controlplane.db import make_engine
from controlplane.models import Base
from controlplane.models.runbook import RunbookRun

MIGRATION = Path(__file__).resolve().parents[2] / "migrations" / "versions" / "0008_runbooks.py"


def _migration():
    spec = importlib.util.spec_from_file_location("migration_0008", MIGRATION)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_migration_matches_the_model_and_goes_back_down(tmp_path: Path) -> None:
    engine = make_engine(f"sqlite:///{tmp_path / 'fd.db'}")
    others = [t for t in Base.metadata.sorted_tables if t.name != RunbookRun.__tablename__]
    Base.metadata.create_all(engine, tables=others)
    migration = _migration()
    assert migration.down_revision == "0007"
    with engine.begin() as connection, Operations.context(MigrationContext.configure(connection)):
        migration.upgrade()
    with engine.connect() as connection:
        assert compare_metadata(MigrationContext.configure(connection), Base.metadata) == []
    with engine.begin() as connection, Operations.context(MigrationContext.configure(connection)):
        migration.downgrade()
    assert RunbookRun.__tablename__ not in inspect(engine).get_table_names()
    engine.dispose()
