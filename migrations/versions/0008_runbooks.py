"""Runbooks: one row per run of a registered runbook script (request, approval, steps, output).

Revision ID: 0008
Revises: 0007
Create Date: 2026-11-30
"""

import sqlalchemy as sa
from alembic import op

from controlplane.models import UtcDateTime

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "runbook_runs",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("runbook", sa.String(64), nullable=False),
        sa.Column("params", sa.JSON(), nullable=False),
        sa.Column("target", sa.String(160), nullable=False),
        sa.Column("active_target", sa.String(160), nullable=True),
        sa.Column("trigger", sa.String(16), nullable=False),
        sa.Column("reason", sa.Text(), nullable=False),
        sa.Column("state", sa.String(24), nullable=False),
        sa.Column("dry_run", sa.Boolean(), nullable=False),
        sa.Column("from_step", sa.String(64), nullable=True),
        sa.Column("resumed_from", sa.Integer(), nullable=True),
        sa.Column("requested_by", sa.String(128), nullable=False),
        sa.Column("requested_by_id", sa.Integer(), nullable=True),
        sa.Column("requested_at", UtcDateTime(), nullable=False),
        sa.Column("approval_deadline", UtcDateTime(), nullable=True),
        sa.Column("approved_by", sa.String(128), nullable=True),
        sa.Column("approved_at", UtcDateTime(), nullable=True),
        sa.Column("started_at", UtcDateTime(), nullable=True),
        sa.Column("deadline", UtcDateTime(), nullable=True),
        sa.Column("finished_at", UtcDateTime(), nullable=True),
        sa.Column("token_id", sa.Integer(), nullable=True),
        sa.Column("exit_code", sa.Integer(), nullable=True),
        sa.Column("steps", sa.JSON(), nullable=False),
        sa.Column("output", sa.Text(), nullable=False),
        sa.Column("error", sa.Text(), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_runbook_runs")),
        sa.UniqueConstraint("active_target", name=op.f("uq_runbook_runs_active_target")),
    )
    op.create_index(op.f("ix_runbook_runs_state"), "runbook_runs", ["state"])
    op.create_index("ix_runbook_runs_runbook_id", "runbook_runs", ["runbook", "id"])


def downgrade() -> None:
    op.drop_index("ix_runbook_runs_runbook_id", table_name="runbook_runs")
    op.drop_index(op.f("ix_runbook_runs_state"), table_name="runbook_runs")
    op.drop_table("runbook_runs")
