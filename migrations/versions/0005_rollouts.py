"""Rollouts: desired state per model, rollouts, their measurements, and per-process slot status.

Revision ID: 0005
Revises: 0004
Create Date: 2026-11-30
"""

import sqlalchemy as sa
from alembic import op

from controlplane.models import UtcDateTime

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "deployments",
        sa.Column("model", sa.String(128), nullable=False),
        sa.Column("blue_version", sa.String(64), nullable=True),
        sa.Column("green_version", sa.String(64), nullable=True),
        sa.Column("blue_weight", sa.Integer(), nullable=False),
        sa.Column("green_weight", sa.Integer(), nullable=False),
        sa.Column("stable_slot", sa.String(8), nullable=False),
        sa.Column("shadow_slot", sa.String(8), nullable=True),
        sa.Column("generation", sa.Integer(), nullable=False),
        sa.Column("updated_at", UtcDateTime(), nullable=False),
        sa.PrimaryKeyConstraint("model", name=op.f("pk_deployments")),
    )
    op.create_table(
        "rollouts",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("model", sa.String(128), nullable=False),
        sa.Column("from_version", sa.String(64), nullable=True),
        sa.Column("to_version", sa.String(64), nullable=False),
        sa.Column("candidate_slot", sa.String(8), nullable=False),
        sa.Column("strategy", sa.String(16), nullable=False),
        sa.Column("steps", sa.JSON(), nullable=False),
        sa.Column("step_index", sa.Integer(), nullable=False),
        sa.Column("step_started_at", UtcDateTime(), nullable=True),
        sa.Column("pause_s", sa.Double(), nullable=False),
        sa.Column("shadow", sa.Boolean(), nullable=False),
        sa.Column("policy", sa.JSON(), nullable=False),
        sa.Column("state", sa.String(16), nullable=False),
        sa.Column("reason", sa.Text(), nullable=False),
        sa.Column("created_by", sa.String(128), nullable=False),
        sa.Column("created_at", UtcDateTime(), nullable=False),
        sa.Column("updated_at", UtcDateTime(), nullable=False),
        sa.Column("finished_at", UtcDateTime(), nullable=True),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_rollouts")),
    )
    op.create_index("ix_rollouts_model_state", "rollouts", ["model", "state"])
    op.create_table(
        "rollout_measurements",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("rollout_id", sa.Integer(), nullable=False),
        sa.Column("step_index", sa.Integer(), nullable=False),
        sa.Column("ts", UtcDateTime(), nullable=False),
        sa.Column("verdict", sa.String(16), nullable=False),
        sa.Column("reasons", sa.JSON(), nullable=False),
        sa.Column("figures", sa.JSON(), nullable=False),
        sa.ForeignKeyConstraint(
            ["rollout_id"],
            ["rollouts.id"],
            name=op.f("fk_rollout_measurements_rollout_id_rollouts"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_rollout_measurements")),
    )
    op.create_index(op.f("ix_rollout_measurements_rollout_id"), "rollout_measurements", ["rollout_id"])
    op.create_table(
        "slot_status",
        sa.Column("process", sa.String(128), nullable=False),
        sa.Column("model", sa.String(128), nullable=False),
        sa.Column("slot", sa.String(8), nullable=False),
        sa.Column("version", sa.String(64), nullable=True),
        sa.Column("state", sa.String(16), nullable=False),
        sa.Column("error", sa.Text(), nullable=False),
        sa.Column("generation", sa.Integer(), nullable=False),
        sa.Column("updated_at", UtcDateTime(), nullable=False),
        sa.PrimaryKeyConstraint("process", "model", "slot", name=op.f("pk_slot_status")),
    )


def downgrade() -> None:
    op.drop_table("slot_status")
    op.drop_table("rollout_measurements")
    op.drop_table("rollouts")
    op.drop_table("deployments")
