"""Customers and their balance transactions (step 2, issue #12: the credit migration).

Revision ID: 0002
Revises: 0001

``balance`` is the sum of the customer's balance transactions, kept on the row so it is read
without summing; both move in the transaction that inserts the balance transaction. ``currency``
is null until the first balance transaction sets it, as at Stripe.
"""

from __future__ import annotations

from durable_assets.payments.migrations.legacy import apply_step

revision = "0002"
down_revision = "0001"

STEP_2 = """
CREATE TABLE customers (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    id TEXT NOT NULL UNIQUE,
    email TEXT,
    name TEXT,
    metadata TEXT NOT NULL,
    currency TEXT,
    balance INTEGER NOT NULL DEFAULT 0,
    invoice_prefix TEXT NOT NULL,
    created INTEGER NOT NULL
);
CREATE INDEX customers_by_email ON customers (email, seq);
CREATE TABLE customer_balance_transactions (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    id TEXT NOT NULL UNIQUE,
    customer TEXT NOT NULL REFERENCES customers (id),
    amount INTEGER NOT NULL CHECK (amount <> 0),
    currency TEXT NOT NULL,
    description TEXT,
    metadata TEXT NOT NULL,
    ending_balance INTEGER NOT NULL,
    created INTEGER NOT NULL
);
CREATE INDEX balance_transactions_by_customer ON customer_balance_transactions (customer, seq);
"""


def upgrade() -> None:
    apply_step(2, STEP_2)
