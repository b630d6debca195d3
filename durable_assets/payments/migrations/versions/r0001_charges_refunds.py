"""Charges, refunds, idempotency keys and counters: the store's first schema (step 1).

Revision ID: 0001
Revises:

As the store created it before customers existed.
"""

from __future__ import annotations

from durable_assets.payments.migrations.legacy import apply_step

revision = "0001"
down_revision = None

STEP_1 = """
CREATE TABLE IF NOT EXISTS charges (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    id TEXT NOT NULL UNIQUE,
    amount INTEGER NOT NULL CHECK (amount > 0),
    amount_refunded INTEGER NOT NULL DEFAULT 0
        CHECK (amount_refunded >= 0 AND amount_refunded <= amount),
    currency TEXT NOT NULL,
    customer TEXT,
    description TEXT,
    metadata TEXT NOT NULL,
    created INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS refunds (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    id TEXT NOT NULL UNIQUE,
    charge TEXT NOT NULL REFERENCES charges (id),
    amount INTEGER NOT NULL CHECK (amount > 0),
    currency TEXT NOT NULL,
    reason TEXT,
    metadata TEXT NOT NULL,
    status TEXT NOT NULL,
    created INTEGER NOT NULL
);
CREATE INDEX IF NOT EXISTS refunds_by_charge ON refunds (charge, seq);
CREATE TABLE IF NOT EXISTS idempotency_keys (
    endpoint TEXT NOT NULL,
    key TEXT NOT NULL,
    fingerprint TEXT NOT NULL,
    http_status INTEGER NOT NULL,
    body TEXT NOT NULL,
    created REAL NOT NULL,
    PRIMARY KEY (endpoint, key)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS counters (
    name TEXT PRIMARY KEY,
    value INTEGER NOT NULL
) WITHOUT ROWID;
"""


def upgrade() -> None:
    apply_step(1, STEP_1)
