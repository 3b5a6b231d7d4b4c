"""Run Alembic migrations programmatically (the only way the schema changes)."""

from __future__ import annotations

from importlib.resources import files
from pathlib import Path

from alembic import command
from alembic.config import Config

# NOTE: the top-level `migrations` package ships in the wheel, so this is a real folder in a checkout
# and in site-packages alike (Alembic needs a folder, not a zip).
MIGRATIONS = Path(str(files("migrations")))


def alembic_config(url: str) -> Config:
    """Return an Alembic config pointing at our migrations and `url`."""
    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS))
    config.set_main_option("sqlalchemy.url", url.replace("%", "%%"))
    return config


def upgrade(url: str, revision: str = "head") -> None:
    """Upgrade the database at `url` to `revision`."""
    command.upgrade(alembic_config(url), revision)
