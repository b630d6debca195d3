"""Delivered messages (one per message id) and the delivery counters.

Revision ID: 0001
Revises:

``IF NOT EXISTS``, as the mailbox created them before it was versioned: such a file is adopted with
its messages.
"""

from __future__ import annotations

from alembic import op

revision = "0001"
down_revision = None


def upgrade() -> None:
    op.execute(
        "CREATE TABLE IF NOT EXISTS messages (message_id TEXT PRIMARY KEY, recipient TEXT NOT NULL,"
        " subject TEXT NOT NULL, body TEXT NOT NULL, sent_at REAL NOT NULL)"
    )
    op.execute("CREATE TABLE IF NOT EXISTS counters (name TEXT PRIMARY KEY, value INTEGER NOT NULL)")
