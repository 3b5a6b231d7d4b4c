"""Alertmanager's notification model: a route per receiver, aggregation groups, longer group keys.

Revision ID: 0013
Revises: 0012
Create Date: 2026-12-01
"""

import sqlalchemy as sa
from alembic import op

from controlplane.models import UtcDateTime

revision = "0013"
down_revision = "0012"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("receivers") as batch:
        batch.add_column(sa.Column("group_by", sa.JSON(), nullable=True))
        batch.add_column(sa.Column("group_wait_s", sa.Double(), nullable=True))
        batch.add_column(sa.Column("group_interval_s", sa.Double(), nullable=True))
        batch.add_column(sa.Column("repeat_interval_s", sa.Double(), nullable=True))
        batch.add_column(sa.Column("backoff_until", UtcDateTime(), nullable=True))
    op.create_table(
        "notification_groups",
        sa.Column("receiver", sa.String(length=64), nullable=False),
        sa.Column("group_key", sa.String(length=512), nullable=False),
        sa.Column("labels", sa.JSON(), nullable=False),
        sa.Column("next_flush_at", UtcDateTime(), nullable=False),
        sa.Column("last_notified_at", UtcDateTime(), nullable=True),
        sa.Column("notified", sa.JSON(), nullable=False),
        sa.PrimaryKeyConstraint("receiver", "group_key", name=op.f("pk_notification_groups")),
    )
    with op.batch_alter_table("outbox") as batch:
        batch.alter_column("group_key", existing_type=sa.String(length=256), type_=sa.String(length=512))
        batch.add_column(sa.Column("maybe_delivered", sa.Boolean(), nullable=False, server_default=sa.false()))
        batch.create_index("ix_outbox_receiver_group", ["receiver", "group_key"], unique=False)


def downgrade() -> None:
    with op.batch_alter_table("outbox") as batch:
        batch.drop_index("ix_outbox_receiver_group")
        batch.drop_column("maybe_delivered")
        batch.alter_column("group_key", existing_type=sa.String(length=512), type_=sa.String(length=256))
    op.drop_table("notification_groups")
    with op.batch_alter_table("receivers") as batch:
        batch.drop_column("backoff_until")
        batch.drop_column("repeat_interval_s")
        batch.drop_column("group_interval_s")
        batch.drop_column("group_wait_s")
        batch.drop_column("group_by")
