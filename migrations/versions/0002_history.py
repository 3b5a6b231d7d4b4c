"""History: per-slot interval samples and per-device memory samples.

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-30
"""

import sqlalchemy as sa
from alembic import op

from controlplane.models import UtcDateTime

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "slot_samples",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("ts", UtcDateTime(), nullable=False),
        sa.Column("resolution_s", sa.Integer(), nullable=False),
        sa.Column("interval_s", sa.Double(), nullable=False),
        sa.Column("process", sa.String(128), nullable=False),
        sa.Column("model", sa.String(128), nullable=False),
        sa.Column("version", sa.String(64), nullable=False),
        sa.Column("slot", sa.String(8), nullable=False),
        sa.Column("successes", sa.Integer(), nullable=False),
        sa.Column("errors", sa.Integer(), nullable=False),
        sa.Column("timeouts", sa.Integer(), nullable=False),
        sa.Column("rejections", sa.Integer(), nullable=False),
        sa.Column("latency_hist", sa.JSON(), nullable=False),
        sa.Column("latency_sum_s", sa.Double(), nullable=False),
        sa.Column("queue_depth_max", sa.Integer(), nullable=False),
        sa.Column("queue_depth_mean", sa.Double(), nullable=False),
        sa.Column("batches", sa.Integer(), nullable=False),
        sa.Column("batch_sizes", sa.JSON(), nullable=False),
        sa.Column("real_tokens", sa.Integer(), nullable=False),
        sa.Column("padded_tokens", sa.Integer(), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_slot_samples")),
    )
    op.create_index("ix_slot_samples_model_ts", "slot_samples", ["model", "ts"])
    op.create_index("ix_slot_samples_res_ts", "slot_samples", ["resolution_s", "ts"])
    op.create_table(
        "device_samples",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("ts", UtcDateTime(), nullable=False),
        sa.Column("resolution_s", sa.Integer(), nullable=False),
        sa.Column("interval_s", sa.Double(), nullable=False),
        sa.Column("process", sa.String(128), nullable=False),
        sa.Column("device", sa.String(32), nullable=False),
        sa.Column("name", sa.String(128), nullable=False),
        sa.Column("utilization", sa.Double(), nullable=True),
        sa.Column("memory_used_bytes", sa.BigInteger(), nullable=True),
        sa.Column("memory_total_bytes", sa.BigInteger(), nullable=True),
        sa.Column("reserved_bytes", sa.BigInteger(), nullable=True),
        sa.Column("in_use_bytes", sa.BigInteger(), nullable=True),
        sa.Column("fragmentation", sa.Double(), nullable=True),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_device_samples")),
    )
    op.create_index("ix_device_samples_res_ts", "device_samples", ["resolution_s", "ts"])


def downgrade() -> None:
    op.drop_table("device_samples")
    op.drop_table("slot_samples")
