"""Shadow traffic: per-slot counts of compared and agreeing shadow outputs.

Revision ID: 0006
Revises: 0005
Create Date: 2026-11-30
"""

import sqlalchemy as sa
from alembic import op

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("slot_samples") as batch:
        batch.add_column(sa.Column("shadow_compared", sa.Integer(), nullable=False, server_default="0"))
        batch.add_column(sa.Column("shadow_agreed", sa.Integer(), nullable=False, server_default="0"))


def downgrade() -> None:
    with op.batch_alter_table("slot_samples") as batch:
        batch.drop_column("shadow_agreed")
        batch.drop_column("shadow_compared")
