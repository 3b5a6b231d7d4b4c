"""Login failures in the database, so every worker and node shares one login throttle.

Revision ID: 0010
Revises: 0009
Create Date: 2026-11-30
"""

import sqlalchemy as sa
from alembic import op

revision = "0010"
down_revision = "0009"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "login_failures",
        sa.Column("key_hash", sa.String(length=64), nullable=False),
        sa.Column("failures", sa.Integer(), nullable=False),
        sa.Column("last_at", sa.Double(), nullable=False),
        sa.Column("locked_until", sa.Double(), nullable=False),
        sa.PrimaryKeyConstraint("key_hash", name=op.f("pk_login_failures")),
    )
    with op.batch_alter_table("login_failures", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_login_failures_last_at"), ["last_at"], unique=False)


def downgrade() -> None:
    with op.batch_alter_table("login_failures", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_login_failures_last_at"))
    op.drop_table("login_failures")
