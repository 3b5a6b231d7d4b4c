"""Idle timeouts and the admin's list of sessions: last use, address and agent on each login session.

Revision ID: 0014
Revises: 0013
Create Date: 2026-12-01
"""

import sqlalchemy as sa
from alembic import op

from controlplane.models import UtcDateTime

revision = "0014"
down_revision = "0013"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # NOTE: nullable: a session opened before this revision counts as last used when it was created.
    with op.batch_alter_table("login_sessions") as batch:
        batch.add_column(sa.Column("last_used_at", UtcDateTime(), nullable=True))
        batch.add_column(sa.Column("address", sa.String(length=64), nullable=True))
        batch.add_column(sa.Column("user_agent", sa.String(length=256), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("login_sessions") as batch:
        batch.drop_column("user_agent")
        batch.drop_column("address")
        batch.drop_column("last_used_at")
