"""durable_step_leases and durable_rate_limits: distributed execution (issue #13).

Revision ID: 0003
Revises: 0002

A step lease tells the orchestrator of a distributed run that the task running a step is alive
(and which execution of it is the current one); a rate-limit row is one token bucket that every
worker of every batch draws from, so N workers together stay within the account's limit.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "durable_step_leases",
        sa.Column("run_id", sa.String(64), nullable=False),
        sa.Column("step_key", sa.String(255), nullable=False),
        sa.Column("batch_id", sa.String(64), nullable=False),
        sa.Column("attempt", sa.Integer, nullable=False),
        sa.Column("owner", sa.String(255), nullable=False),
        sa.Column("heartbeat_at", sa.Float, nullable=False),
        sa.Column("expires_at", sa.Float, nullable=False),
        sa.Column("finished", sa.Boolean, nullable=False),
        sa.PrimaryKeyConstraint("run_id", "step_key"),
    )
    op.create_index("ix_durable_step_leases_batch_id", "durable_step_leases", ["batch_id"])
    op.create_table(
        "durable_rate_limits",
        sa.Column("name", sa.String(255), nullable=False),
        sa.Column("tokens", sa.Float, nullable=False),
        sa.Column("updated_at", sa.Float, nullable=False),
        sa.PrimaryKeyConstraint("name"),
    )


def downgrade() -> None:
    op.drop_table("durable_rate_limits")
    op.drop_index("ix_durable_step_leases_batch_id", table_name="durable_step_leases")
    op.drop_table("durable_step_leases")
