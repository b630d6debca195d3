"""Each idempotency key remembers the path it was first used on (issue #34).

Revision ID: 0004
Revises: 0003

Stripe binds a key to the endpoint of its first request: the same key on another endpoint is a 400
``idempotency_error``, not a second, independent request. Keys were stored per endpoint *family*
(``endpoint``, part of the primary key), so reusing one elsewhere silently made a second effect.
``path`` is the request path (``/v1/customers/cus_1/balance_transactions``), found by ``key`` alone
through the new index; the primary key stays, so a file whose key already sits on two endpoints
keeps both rows and each still replays on its own endpoint.

Rows stored before this revision get the path their endpoint implies. A balance transaction's path
names its customer, which a stored success answer carries and a stored error does not: those rows
keep a null path, meaning "this endpoint family, path not recorded", and are compared by endpoint
(the customer is in the parameters' fingerprint, so a replay on another customer is still refused).
The first revision after the hand-rolled steps: plain Alembic, ``PRAGMA user_version`` stays at 3.
"""

from __future__ import annotations

from alembic import op

revision = "0004"
down_revision = "0003"

_STATEMENTS = (
    "ALTER TABLE idempotency_keys ADD COLUMN path TEXT",
    "CREATE INDEX idempotency_keys_by_key ON idempotency_keys (key)",
    "UPDATE idempotency_keys SET path = '/v1/' || endpoint"
    " WHERE endpoint IN ('charges', 'refunds', 'customers')",
    "UPDATE idempotency_keys"
    " SET path = '/v1/customers/' || json_extract(body, '$.customer') || '/balance_transactions'"
    " WHERE endpoint = 'customer_balance_transactions'"
    " AND json_valid(body) AND json_type(body, '$.customer') = 'text'",
)


def upgrade() -> None:
    bind = op.get_bind()
    for statement in _STATEMENTS:
        bind.exec_driver_sql(statement)
