"""durable_shard_progress: each shard's count, so a sharded step's progress is their sum (#24).

Revision ID: 0006
Revises: 0005

The shards of a step run at once on several workers; each wrote its own count over the batch's one
``durable_progress`` row, so ``done``/``of`` jumped between shards and percent_complete went back.
Each shard's count is kept here instead, and the batch's row shows the step's sum of them.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "durable_shard_progress",
        sa.Column("batch_id", sa.String(64), nullable=False),
        sa.Column("step", sa.String(255), nullable=False),
        sa.Column("shards", sa.Integer, nullable=False),
        sa.Column("shard", sa.Integer, nullable=False),
        sa.Column("run_id", sa.String(64), nullable=False),
        sa.Column("done", sa.BigInteger, nullable=False),
        sa.Column("of", sa.BigInteger, nullable=False),
        sa.Column("counted", sa.Boolean, nullable=False),
        sa.Column("updated_at", sa.Float, nullable=False),
        sa.PrimaryKeyConstraint("batch_id", "step", "shards", "shard"),
    )


def downgrade() -> None:
    op.drop_table("durable_shard_progress")
