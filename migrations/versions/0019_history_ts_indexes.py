"""History rows by time alone: the alert rules and charts that read every model's rows in a window.

Without these, `ts > ? AND ts <= ?` with no model scanned the whole table (neither earlier index leads
with `ts`): each alert evaluation read every row the retention keeps, once per slot-metric rule, and an
idle server's evaluation grew with its history.

Revision ID: 0019
Revises: 0018
Create Date: 2026-12-04
"""

from alembic import op

revision = "0019"
down_revision = "0018"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_index("ix_slot_samples_ts", "slot_samples", ["ts"])
    op.create_index("ix_device_samples_ts", "device_samples", ["ts"])


def downgrade() -> None:
    op.drop_index("ix_device_samples_ts", table_name="device_samples")
    op.drop_index("ix_slot_samples_ts", table_name="slot_samples")
