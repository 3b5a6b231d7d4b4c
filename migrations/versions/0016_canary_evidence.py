"""The canary judge's inputs and evidence: compute time per batch size and predicted labels per
history row, and each step analysis's evidence (tests, p-values, effect sizes, samples, floors).

Revision ID: 0016
Revises: 0015
Create Date: 2026-12-02
"""

import sqlalchemy as sa
from alembic import op

revision = "0016"
down_revision = "0015"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # NOTE: nullable: rows written before this revision hold neither (the judge then has no compute strata).
    with op.batch_alter_table("slot_samples") as batch:
        batch.add_column(sa.Column("compute_hist", sa.JSON(), nullable=True))
        batch.add_column(sa.Column("label_counts", sa.JSON(), nullable=True))
    with op.batch_alter_table("rollout_measurements") as batch:
        batch.add_column(sa.Column("evidence", sa.JSON(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("rollout_measurements") as batch:
        batch.drop_column("evidence")
    with op.batch_alter_table("slot_samples") as batch:
        batch.drop_column("label_counts")
        batch.drop_column("compute_hist")
