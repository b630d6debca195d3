"""durable_list_cursors: a provider list's page cursors, remembered across processes.

Revision ID: 0009
Revises: 0008

A list read by cursor is one round trip per page, one after another. A process that knows where
each page began last time asks for all of them at once; the first list in each new process (every
`job run`, every distributed task) did not know, and read page after page.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0009"
down_revision = "0008"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "durable_list_cursors",
        sa.Column("name", sa.String(255), nullable=False),
        sa.Column("cursors", sa.Text, nullable=False),
        sa.Column("updated_at", sa.Float, nullable=False),
        sa.PrimaryKeyConstraint("name"),
    )


def downgrade() -> None:
    op.drop_table("durable_list_cursors")
