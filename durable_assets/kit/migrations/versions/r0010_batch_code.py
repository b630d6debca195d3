"""durable_batch_code and durable_batch_items: the code a batch started with, and each item's key.

Revision ID: 0010
Revises: 0009

Deploys are the first reason a batch's process dies, and nothing recorded which code a batch started
with: a resume on code that spells a key differently sent nothing (the subject guard held) but
reported every item unrefunded, and one that also changed the subject refunded charges twice.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0010"
down_revision = "0009"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "durable_batch_code",
        sa.Column("batch_id", sa.String(64), nullable=False),
        sa.Column("step", sa.String(255), nullable=False),
        sa.Column("version", sa.String(255), nullable=False),
        sa.Column("declared", sa.Boolean, nullable=False),
        sa.Column("pinned_at", sa.Float, nullable=False),
        sa.Column("seen_version", sa.String(255)),
        sa.Column("seen_at", sa.Float),
        sa.Column("accepted_at", sa.Float),
        sa.Column("accepted_from", sa.String(255)),
        sa.PrimaryKeyConstraint("batch_id", "step"),
    )
    op.create_table(
        "durable_batch_items",
        sa.Column("batch_id", sa.String(64), nullable=False),
        sa.Column("scope", sa.String(64), nullable=False),
        sa.Column("item", sa.String(255), nullable=False),
        sa.Column("key", sa.String(255), nullable=False),
        sa.Column("subject", sa.String(255)),
        sa.Column("created_at", sa.Float, nullable=False),
        sa.PrimaryKeyConstraint("batch_id", "scope", "item"),
    )


def downgrade() -> None:
    op.drop_table("durable_batch_items")
    op.drop_table("durable_batch_code")
