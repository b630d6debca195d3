"""Baseline: the tables the kit created with ``create_all`` before durable_effect_subjects.

Revision ID: 0001
Revises:
Create Date: 2026-12-01

Databases made before migrations existed already hold some or all of these tables, with rows we
must keep, and no version table. This revision and 0002 therefore create only what is missing;
every later revision runs only on databases these two have versioned, and is a plain one.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None


def _create_missing(name: str, *elements: sa.Column | sa.Constraint) -> bool:
    if sa.inspect(op.get_bind()).has_table(name):
        return False
    op.create_table(name, *elements)
    return True


def _drop_retired_attempts() -> None:
    """3696cfb retired ``durable_idempotency.attempts``, but ``create_all`` never drops a column.

    An instance made before it kept the column, NOT NULL and without a server default, while every
    insert since omits it: on such an instance every ledger claim failed. Dropping it keeps the rows.
    """
    inspector = sa.inspect(op.get_bind())
    if not inspector.has_table("durable_idempotency"):
        return
    if "attempts" in {c["name"] for c in inspector.get_columns("durable_idempotency")}:
        with op.batch_alter_table("durable_idempotency") as batch:
            batch.drop_column("attempts")


def upgrade() -> None:
    _drop_retired_attempts()
    _create_missing(
        "durable_idempotency",
        sa.Column("scope", sa.String(64), nullable=False),
        sa.Column("key", sa.String(255), nullable=False),
        sa.Column("fingerprint", sa.String(64), nullable=False),
        sa.Column("recovery_point", sa.String(16), nullable=False),
        sa.Column("params", sa.Text, nullable=False),
        sa.Column("result", sa.Text),
        sa.Column("owner_run", sa.String(64)),
        sa.Column("claimed_by", sa.String(64)),
        sa.Column("claim_fence", sa.BigInteger, nullable=False),
        sa.Column("claim_expires_at", sa.Float, nullable=False),
        sa.Column("created_at", sa.Float, nullable=False),
        sa.Column("updated_at", sa.Float, nullable=False),
        sa.PrimaryKeyConstraint("scope", "key"),
    )
    _create_missing(
        "durable_leases",
        sa.Column("batch_id", sa.String(64), nullable=False),
        sa.Column("run_id", sa.String(64), nullable=False),
        sa.Column("owner", sa.String(255), nullable=False),
        sa.Column("fence", sa.BigInteger, nullable=False),
        sa.Column("heartbeat_at", sa.Float, nullable=False),
        sa.Column("expires_at", sa.Float, nullable=False),
        sa.Column("released", sa.Boolean, nullable=False),
        sa.PrimaryKeyConstraint("batch_id"),
    )
    _create_missing(
        "durable_cancel_requests",
        sa.Column("batch_id", sa.String(64), nullable=False),
        sa.Column("requested_at", sa.Float, nullable=False),
        sa.PrimaryKeyConstraint("batch_id"),
    )
    _create_missing(
        "durable_progress",
        sa.Column("batch_id", sa.String(64), nullable=False),
        sa.Column("run_id", sa.String(64), nullable=False),
        sa.Column("step", sa.Integer, nullable=False),
        sa.Column("total", sa.Integer, nullable=False),
        sa.Column("label", sa.String(255), nullable=False),
        sa.Column("done", sa.BigInteger, nullable=False),
        sa.Column("of", sa.BigInteger, nullable=False),
        sa.Column("updated_at", sa.Float, nullable=False),
        sa.PrimaryKeyConstraint("batch_id"),
    )
    # Added by 0bb8556: instances made before the outbox lack it (create_all added it on next open).
    if _create_missing(
        "durable_webhook_outbox",
        sa.Column("webhook_id", sa.String(64), nullable=False),
        sa.Column("url", sa.String(2000), nullable=False),
        sa.Column("batch_id", sa.String(64), nullable=False),
        sa.Column("run_id", sa.String(64)),
        sa.Column("event_type", sa.String(64), nullable=False),
        sa.Column("body", sa.Text, nullable=False),
        sa.Column("state", sa.String(16), nullable=False),
        sa.Column("attempts", sa.Integer, nullable=False),
        sa.Column("next_attempt_at", sa.Float, nullable=False),
        sa.Column("claimed_by", sa.String(64)),
        sa.Column("claim_expires_at", sa.Float, nullable=False),
        sa.Column("last_status", sa.Integer),
        sa.Column("last_error", sa.Text),
        sa.Column("created_at", sa.Float, nullable=False),
        sa.Column("updated_at", sa.Float, nullable=False),
        sa.Column("delivered_at", sa.Float),
        sa.PrimaryKeyConstraint("webhook_id", "url"),
    ):
        op.create_index("ix_durable_webhook_outbox_batch_id", "durable_webhook_outbox", ["batch_id"])


def downgrade() -> None:
    op.drop_index("ix_durable_webhook_outbox_batch_id", table_name="durable_webhook_outbox")
    for name in (
        "durable_webhook_outbox",
        "durable_progress",
        "durable_cancel_requests",
        "durable_leases",
        "durable_idempotency",
    ):
        op.drop_table(name)
