"""Client errors: requests the model refused for their own input, counted apart from server errors.

Revision ID: 0011
Revises: 0010
Create Date: 2026-12-01
"""

import sqlalchemy as sa
from alembic import op

revision = "0011"
down_revision = "0010"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("slot_samples") as batch:
        batch.add_column(sa.Column("client_errors", sa.Integer(), nullable=False, server_default="0"))


def downgrade() -> None:
    with op.batch_alter_table("slot_samples") as batch:
        batch.drop_column("client_errors")
