"""What an operator needs to tell a live process from a dead one: when each serving process started
and which Flightdeck it runs (engine_status is its heartbeat).

Revision ID: 0017
Revises: 0016
Create Date: 2026-12-02
"""

import sqlalchemy as sa
from alembic import op

from controlplane.models import UtcDateTime

revision = "0017"
down_revision = "0016"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # NOTE: nullable / defaulted: rows written by processes of an older release hold neither.
    with op.batch_alter_table("engine_status") as batch:
        batch.add_column(sa.Column("started_at", UtcDateTime(), nullable=True))
        batch.add_column(sa.Column("software_version", sa.String(length=32), nullable=False, server_default=""))


def downgrade() -> None:
    with op.batch_alter_table("engine_status") as batch:
        batch.drop_column("software_version")
        batch.drop_column("started_at")
