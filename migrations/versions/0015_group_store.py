"""Aggregation groups as Alertmanager keeps them (the alerts a group holds, its log's resolved set); client errors by kind.

Revision ID: 0015
Revises: 0014
Create Date: 2026-12-02
"""

import sqlalchemy as sa
from alembic import op

revision = "0015"
down_revision = "0014"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # NOTE: a group stored before this revision holds nothing: it is dormant, kept for what it told,
    # and its alerts start it afresh at the next evaluation (no message is repeated for them).
    with op.batch_alter_table("notification_groups") as batch:
        batch.add_column(sa.Column("held", sa.JSON(), nullable=False, server_default=sa.text("'[]'")))
        batch.add_column(sa.Column("resolved", sa.JSON(), nullable=False, server_default=sa.text("'[]'")))
        batch.add_column(sa.Column("flushed", sa.Boolean(), nullable=False, server_default=sa.false()))
    with op.batch_alter_table("slot_samples") as batch:
        batch.add_column(sa.Column("client_error_kinds", sa.JSON(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("slot_samples") as batch:
        batch.drop_column("client_error_kinds")
    with op.batch_alter_table("notification_groups") as batch:
        batch.drop_column("flushed")
        batch.drop_column("resolved")
        batch.drop_column("held")
