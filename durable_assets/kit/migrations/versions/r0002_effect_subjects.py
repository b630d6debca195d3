"""durable_effect_subjects: at most one idempotency key per business subject (b150e22).

Revision ID: 0002
Revises: 0001
Create Date: 2026-12-01

Like the baseline, creates the table only when missing: the release that introduced it made it
with ``create_all``, so an instance opened by that release already has it, with its claims.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    if sa.inspect(op.get_bind()).has_table("durable_effect_subjects"):
        return
    op.create_table(
        "durable_effect_subjects",
        sa.Column("scope", sa.String(64), nullable=False),
        sa.Column("subject", sa.String(255), nullable=False),
        sa.Column("key", sa.String(255), nullable=False),
        sa.Column("created_at", sa.Float, nullable=False),
        sa.PrimaryKeyConstraint("scope", "subject"),
    )


def downgrade() -> None:
    op.drop_table("durable_effect_subjects")
