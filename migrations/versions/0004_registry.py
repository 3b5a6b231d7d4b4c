"""Registry: pushed model versions.

Revision ID: 0004
Revises: 0003
Create Date: 2026-11-30
"""

import sqlalchemy as sa
from alembic import op

from controlplane.models import UtcDateTime

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "model_versions",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("name", sa.String(64), nullable=False),
        sa.Column("version", sa.String(64), nullable=False),
        sa.Column("sha256", sa.String(64), nullable=False),
        sa.Column("size_bytes", sa.BigInteger(), nullable=False),
        sa.Column("manifest", sa.JSON(), nullable=False),
        sa.Column("path", sa.String(512), nullable=False),
        sa.Column("pushed_by", sa.String(128), nullable=False),
        sa.Column("pushed_at", UtcDateTime(), nullable=False),
        sa.Column("tags", sa.JSON(), nullable=False),
        sa.Column("golden_passed", sa.Boolean(), nullable=True),
        sa.Column("description", sa.Text(), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_model_versions")),
        sa.UniqueConstraint("name", "version", name=op.f("uq_model_versions_name")),
    )
    op.create_index(op.f("ix_model_versions_sha256"), "model_versions", ["sha256"])


def downgrade() -> None:
    op.drop_table("model_versions")
