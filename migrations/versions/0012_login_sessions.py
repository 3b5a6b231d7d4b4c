"""Server-side login sessions (logout ends them everywhere) and each token's parent (revoked with it).

Revision ID: 0012
Revises: 0011
Create Date: 2026-12-01
"""

import sqlalchemy as sa
from alembic import op

from controlplane.models import UtcDateTime

revision = "0012"
down_revision = "0011"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "login_sessions",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("user_id", sa.Integer(), nullable=False),
        sa.Column("id_hash", sa.String(length=64), nullable=False),
        sa.Column("created_at", UtcDateTime(), nullable=False),
        sa.Column("expires_at", UtcDateTime(), nullable=False),
        sa.ForeignKeyConstraint(["user_id"], ["users.id"], name=op.f("fk_login_sessions_user_id_users")),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_login_sessions")),
        sa.UniqueConstraint("id_hash", name=op.f("uq_login_sessions_id_hash")),
    )
    with op.batch_alter_table("login_sessions") as batch:
        batch.create_index(batch.f("ix_login_sessions_user_id"), ["user_id"], unique=False)
        batch.create_index(batch.f("ix_login_sessions_expires_at"), ["expires_at"], unique=False)
    with op.batch_alter_table("api_tokens") as batch:
        batch.add_column(sa.Column("parent_id", sa.Integer(), nullable=True))
        batch.create_index(batch.f("ix_api_tokens_parent_id"), ["parent_id"], unique=False)
        batch.create_foreign_key(batch.f("fk_api_tokens_parent_id_api_tokens"), "api_tokens", ["parent_id"], ["id"])


def downgrade() -> None:
    with op.batch_alter_table("api_tokens") as batch:
        batch.drop_constraint(batch.f("fk_api_tokens_parent_id_api_tokens"), type_="foreignkey")
        batch.drop_index(batch.f("ix_api_tokens_parent_id"))
        batch.drop_column("parent_id")
    with op.batch_alter_table("login_sessions") as batch:
        batch.drop_index(batch.f("ix_login_sessions_expires_at"))
        batch.drop_index(batch.f("ix_login_sessions_user_id"))
    op.drop_table("login_sessions")
