"""durable_item_decisions: what a person decided for a held item, read by every later batch.

Revision ID: 0011
Revises: 0010

A held item (an account whose customer was deleted, a balance changed by hand at the provider) was
held again every night: nothing let a person say "this account gets no customer" or "keep the
provider's balance", so the same review came back until the provider was changed to suit the job.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0011"
down_revision = "0010"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "durable_item_decisions",
        sa.Column("account", sa.String(160), nullable=False),
        sa.Column("job", sa.String(255), nullable=False),
        sa.Column("item", sa.String(255), nullable=False),
        sa.Column("decision", sa.String(64), nullable=False),
        sa.Column("note", sa.Text, nullable=False),
        sa.Column("decided_at", sa.Float, nullable=False),
        sa.Column("decided_by", sa.String(255), nullable=False),
        sa.PrimaryKeyConstraint("account", "job", "item"),
    )


def downgrade() -> None:
    op.drop_table("durable_item_decisions")
