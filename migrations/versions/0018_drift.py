"""Drift: sampled input summaries per history row, and the reference window an operator pins per version.

Revision ID: 0018
Revises: 0017
Create Date: 2026-12-02
"""

import sqlalchemy as sa
from alembic import op

from controlplane.models import UtcDateTime

revision = "0018"
down_revision = "0017"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # NOTE: nullable: rows written before this revision (and versions with no numeric input) hold none.
    with op.batch_alter_table("slot_samples") as batch:
        batch.add_column(sa.Column("input_summaries", sa.JSON(), nullable=True))
    op.create_table(
        "drift_references",
        sa.Column("model", sa.String(length=128), nullable=False),
        sa.Column("version", sa.String(length=64), nullable=False),
        sa.Column("start", UtcDateTime(), nullable=False),
        sa.Column("end", UtcDateTime(), nullable=False),
        sa.Column("pinned_by", sa.String(length=128), nullable=False),
        sa.Column("pinned_at", UtcDateTime(), nullable=False),
        sa.PrimaryKeyConstraint("model", "version", name=op.f("pk_drift_references")),
    )


def downgrade() -> None:
    op.drop_table("drift_references")
    with op.batch_alter_table("slot_samples") as batch:
        batch.drop_column("input_summaries")
