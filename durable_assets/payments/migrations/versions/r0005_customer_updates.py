"""A customer's ``description``, and charges found by customer (issue #34: customer update, charge list).

Revision ID: 0005
Revises: 0004

``POST /v1/customers/{id}`` sets ``description`` as Stripe does; it was always answered null. The
index serves ``GET /v1/charges?customer=...`` newest first without reading every charge.
"""

from __future__ import annotations

from alembic import op

revision = "0005"
down_revision = "0004"

_STATEMENTS = (
    "ALTER TABLE customers ADD COLUMN description TEXT",
    "CREATE INDEX charges_by_customer ON charges (customer, seq)",
)


def upgrade() -> None:
    bind = op.get_bind()
    for statement in _STATEMENTS:
        bind.exec_driver_sql(statement)
