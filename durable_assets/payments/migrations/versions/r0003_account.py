"""The provider account the file is, and deleted customers kept as rows (step 3, issue #20).

Revision ID: 0003
Revises: 0002

The ledger files every effect under the account it went to,
so a store file must name itself, stably, as a Stripe account does. One row, made when the file
gets this version (new or upgraded), inside the migration's write transaction, so two processes
opening an old file at once agree on one id. Deleted customers stay as rows marked ``deleted``:
Stripe still answers their id (``deleted: true``) and their balance transactions must not dangle.
"""

from __future__ import annotations

import secrets
import string
import time

from alembic import op

from durable_assets.payments.migrations.legacy import apply_step

revision = "0003"
down_revision = "0002"

STEP_3 = """
CREATE TABLE account (
    singleton INTEGER PRIMARY KEY CHECK (singleton = 1),
    id TEXT NOT NULL,
    created INTEGER NOT NULL
);
ALTER TABLE customers ADD COLUMN deleted INTEGER NOT NULL DEFAULT 0;
"""
#: Stripe's account ids: ``acct_`` and 16 letters or digits.
_ACCOUNT_ID = 16


def upgrade() -> None:
    if apply_step(3, STEP_3):
        alphabet = string.ascii_letters + string.digits
        account_id = "acct_" + "".join(secrets.choice(alphabet) for _ in range(_ACCOUNT_ID))
        op.get_bind().exec_driver_sql(
            "INSERT INTO account (singleton, id, created) VALUES (1, ?, ?)", (account_id, int(time.time()))
        )
