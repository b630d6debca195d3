"""durable_stop_requests: Ctrl-C or SIGTERM of a distributed batch's `job run` reaches its tasks.

Revision ID: 0008
Revises: 0007

The process-wide stop flag only reaches the threads of the process that received the signal. A
distributed run's steps run on workers, which went on sending until the whole batch was done; a row
here, read with the cancel and the lease before every request, stops them at the next safe point.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "durable_stop_requests",
        sa.Column("batch_id", sa.String(64), nullable=False),
        sa.Column("run_id", sa.String(64), nullable=False),
        sa.Column("signal", sa.Integer, nullable=False),
        sa.Column("requested_at", sa.Float, nullable=False),
        sa.PrimaryKeyConstraint("batch_id", "run_id"),
    )


def downgrade() -> None:
    op.drop_table("durable_stop_requests")
