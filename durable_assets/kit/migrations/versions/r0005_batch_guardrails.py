"""durable_batch_guardrails: the ceilings and limits a batch runs under, pinned at its first run (#21).

Revision ID: 0005
Revises: 0004

A guardrail read from each process's environment can be lost by opening another terminal: a batch
stopped by a low ceiling, resumed from a shell without that variable, would send everything. The
values in force when the batch first runs are stored here, and every later run of the batch uses
them until an operator overrides them on purpose (``job resume --override-guardrails``), which is
recorded in the same row.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "durable_batch_guardrails",
        sa.Column("batch_id", sa.String(64), nullable=False),
        sa.Column("name", sa.String(128), nullable=False),
        sa.Column("guardrail_values", sa.Text, nullable=False),
        sa.Column("pinned_at", sa.Float, nullable=False),
        sa.Column("overridden_at", sa.Float),
        sa.Column("overridden_from", sa.Text),
        sa.PrimaryKeyConstraint("batch_id", "name"),
    )


def downgrade() -> None:
    op.drop_table("durable_batch_guardrails")
