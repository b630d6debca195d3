"""durable_blobs: step outputs, batch files and stored inputs in the instance's database (#24).

Revision ID: 0007
Revises: 0006

A step on one host could not read what a step on another host returned, nor could a person open the
quarantine file from any host but the one that wrote it: both lived under ``DAGSTER_HOME``. With
``DURABLE_STORAGE=database`` (the default of a Postgres instance) they are rows here instead.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "durable_blobs",
        sa.Column("key", sa.String(1024), nullable=False),
        sa.Column("data", sa.LargeBinary, nullable=False),
        sa.Column("size", sa.BigInteger, nullable=False),
        sa.Column("stored_at", sa.Float, nullable=False),
        sa.PrimaryKeyConstraint("key"),
    )


def downgrade() -> None:
    op.drop_table("durable_blobs")
