"""Alembic's migration scripts, shipped with the package; `controlplane.migrate` points Alembic here."""
