"""Keys per provider account, and the account each batch is bound to (issue #20).

Revision ID: 0004
Revises: 0003

``durable_idempotency`` and ``durable_effect_subjects`` gain ``account`` as the first column of
their primary key: Stripe scopes idempotency keys per account, and so must we. Rows written before
this revision get the empty namespace (``kit.accounts.UNBOUND_NAMESPACE``); the first batch the
upgraded instance binds to an account adopts them (``AccountBindings.bind``), since that is the
account the instance was talking to when they were made. ``durable_batch_accounts`` is new.

A primary key cannot be altered in place on SQLite, so there each table is copied into its new
shape in the upgrade's one transaction; on Postgres the key is dropped and re-created.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None

_KEYED = {
    # table: (its other key columns, its non-key columns with their types)
    "durable_idempotency": (
        ("scope", "key"),
        (
            ("fingerprint", "VARCHAR(64) NOT NULL"),
            ("recovery_point", "VARCHAR(16) NOT NULL"),
            ("params", "TEXT NOT NULL"),
            ("result", "TEXT"),
            ("owner_run", "VARCHAR(64)"),
            ("claimed_by", "VARCHAR(64)"),
            ("claim_fence", "BIGINT NOT NULL"),
            ("claim_expires_at", "FLOAT NOT NULL"),
            ("created_at", "FLOAT NOT NULL"),
            ("updated_at", "FLOAT NOT NULL"),
        ),
    ),
    "durable_effect_subjects": (
        ("scope", "subject"),
        (("key", "VARCHAR(255) NOT NULL"), ("created_at", "FLOAT NOT NULL")),
    ),
}
_KEY_TYPES = {
    "scope": "VARCHAR(64) NOT NULL",
    "key": "VARCHAR(255) NOT NULL",
    "subject": "VARCHAR(255) NOT NULL",
}


def _sqlite_rebuild(table: str, keys: tuple[str, ...], columns: tuple[tuple[str, str], ...]) -> None:
    names = [*keys, *(name for name, _type in columns)]
    defs = [f'"{k}" {_KEY_TYPES[k]}' for k in keys] + [f'"{n}" {t}' for n, t in columns]
    quoted = ", ".join(f'"{n}"' for n in names)
    key_list = ", ".join(f'"{k}"' for k in keys)
    op.execute(
        f'CREATE TABLE "{table}_0004" ("account" VARCHAR(160) NOT NULL, {", ".join(defs)}, '
        f'PRIMARY KEY ("account", {key_list}))'
    )
    op.execute(f'INSERT INTO "{table}_0004" ("account", {quoted}) SELECT \'\', {quoted} FROM "{table}"')
    op.execute(f'DROP TABLE "{table}"')
    op.execute(f'ALTER TABLE "{table}_0004" RENAME TO "{table}"')


def upgrade() -> None:
    bind = op.get_bind()
    for table, (keys, columns) in _KEYED.items():
        if bind.dialect.name == "sqlite":
            _sqlite_rebuild(table, keys, columns)
            continue
        pk = sa.inspect(bind).get_pk_constraint(table).get("name") or f"{table}_pkey"
        op.add_column(table, sa.Column("account", sa.String(160), nullable=False, server_default=""))
        op.alter_column(table, "account", server_default=None)
        op.drop_constraint(pk, table, type_="primary")
        op.create_primary_key(pk, table, ["account", *keys])
    op.create_table(
        "durable_batch_accounts",
        sa.Column("batch_id", sa.String(64), nullable=False),
        sa.Column("kind", sa.String(32), nullable=False),
        sa.Column("account", sa.String(128), nullable=False),
        sa.Column("livemode", sa.Boolean, nullable=False),
        sa.Column("bound_at", sa.Float, nullable=False),
        sa.PrimaryKeyConstraint("batch_id"),
    )


def downgrade() -> None:
    raise NotImplementedError(
        "0004 cannot be undone: without the account column, keys settled at two provider accounts "
        "would collide. Restore a backup taken before the upgrade instead."
    )
