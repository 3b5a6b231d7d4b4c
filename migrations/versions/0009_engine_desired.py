"""Engine-wide desired state (batching limits, memory compaction), what each process applied, slot reloads.

Revision ID: 0009
Revises: 0008
Create Date: 2026-12-01
"""

from datetime import UTC, datetime

import sqlalchemy as sa
from alembic import op

from controlplane.models import UtcDateTime

revision = "0009"
down_revision = "0008"
branch_labels = None
depends_on = None


def upgrade() -> None:
    desired = op.create_table(
        "engine_desired",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("generation", sa.Integer(), nullable=False),
        sa.Column("compact_generation", sa.Integer(), nullable=False),
        sa.Column("max_batch_size", sa.Integer(), nullable=True),
        sa.Column("max_queue_delay_ms", sa.Double(), nullable=True),
        sa.Column("max_queue_size", sa.Integer(), nullable=True),
        sa.Column("updated_at", UtcDateTime(), nullable=False),
        sa.Column("updated_by", sa.String(length=128), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_engine_desired")),
    )
    # The one row: every limit null (each process keeps its own settings), nothing asked for yet.
    op.bulk_insert(
        desired,
        [
            {
                "id": 1,
                "generation": 1,
                "compact_generation": 0,
                "updated_at": datetime.now(UTC),
                "updated_by": "migration",
            }
        ],
    )
    op.create_table(
        "engine_status",
        sa.Column("process", sa.String(length=128), nullable=False),
        sa.Column("generation", sa.Integer(), nullable=False),
        sa.Column("compact_generation", sa.Integer(), nullable=False),
        sa.Column("error", sa.Text(), nullable=False),
        sa.Column("report", sa.JSON(), nullable=True),
        sa.Column("updated_at", UtcDateTime(), nullable=False),
        sa.PrimaryKeyConstraint("process", name=op.f("pk_engine_status")),
    )
    with op.batch_alter_table("engine_status", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_engine_status_updated_at"), ["updated_at"], unique=False)
    with op.batch_alter_table("deployments") as batch:
        batch.add_column(sa.Column("blue_reload", sa.Integer(), nullable=False, server_default="0"))
        batch.add_column(sa.Column("green_reload", sa.Integer(), nullable=False, server_default="0"))


def downgrade() -> None:
    with op.batch_alter_table("deployments") as batch:
        batch.drop_column("green_reload")
        batch.drop_column("blue_reload")
    with op.batch_alter_table("engine_status", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_engine_status_updated_at"))
    op.drop_table("engine_status")
    op.drop_table("engine_desired")
