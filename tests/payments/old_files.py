"""Payments store files as the releases before Alembic left them, with rows an upgrade must keep.

They are made with the hand-rolled steps' SQL, which revisions 0001-0003 carry unchanged; the SHA-256
of each, taken from store.py at ceb60f8 (the last release with the steps), pins it to what shipped.
"""

from __future__ import annotations

import hashlib
import importlib
import sqlite3
from contextlib import closing
from pathlib import Path
from typing import Any

#: step number: (its revision module, the SHA-256 of its SQL as ``_SCHEMA_V<step>`` shipped)
SHIPPED_STEPS = {
    1: ("r0001_charges_refunds", "ae8e45f4973372897a2181fb4246455ee4ecb7b4646fbe41bb5f13082810ec34"),
    2: ("r0002_customers", "31674cce7771178924ca6f53d862626aa8fc4a8eb4ead84cd13a7995afcae053"),
    3: ("r0003_account", "da2aff77d53e75abe69d8ebfb57384a23bcafee28d1356c0788961f2b868db63"),
}
#: The account row of a file made at step 3 (its code drew a random id once).
OLD_ACCOUNT = "acct_0ldF1leAccount01"


def step_sql(step: int) -> str:
    """The SQL of a hand-rolled step, as its revision carries it."""
    module = importlib.import_module(f"durable_assets.payments.migrations.versions.{SHIPPED_STEPS[step][0]}")
    return str(getattr(module, f"STEP_{step}"))


def sha256(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def old_store_file(path: Path, version: int) -> None:
    """A file at ``PRAGMA user_version = version``: a charge refunded in part and, from step 2 on, a
    customer."""
    conn = sqlite3.connect(path, isolation_level=None)
    for step in range(1, version + 1):
        conn.executescript(step_sql(step))
    if version >= 3:
        conn.execute("INSERT INTO account (singleton, id, created) VALUES (1, ?, 1700000000)", (OLD_ACCOUNT,))
    conn.execute(
        "INSERT INTO charges (id, amount, amount_refunded, currency, metadata, created)"
        " VALUES ('ch_old', 100, 40, 'usd', '{}', 1)"
    )
    conn.execute(
        "INSERT INTO refunds (id, charge, amount, currency, metadata, status, created)"
        " VALUES ('re_old', 'ch_old', 40, 'usd', '{}', 'succeeded', 1)"
    )
    if version >= 2:
        conn.execute(
            "INSERT INTO customers (id, metadata, invoice_prefix, created) VALUES ('cus_old', '{}', 'ABC', 0)"
        )
    conn.execute(f"PRAGMA user_version = {version}")
    conn.close()


def columns(path: Path) -> dict[str, list[str]]:
    """Each table's columns (SQLite's own bookkeeping left out)."""
    with closing(sqlite3.connect(path)) as conn:
        names = [n for (n,) in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")]
        return {
            n: [c[1] for c in conn.execute(f"PRAGMA table_info({n})")]
            for n in names
            if n != "sqlite_sequence"
        }


def rows(path: Path, tables: dict[str, list[str]]) -> dict[str, set[tuple[Any, ...]]]:
    """The rows of ``tables``, each read through the columns given for it."""
    with closing(sqlite3.connect(path)) as conn:
        return {
            name: set(conn.execute(f"SELECT {', '.join(cols)} FROM {name}")) for name, cols in tables.items()
        }


#: What revisions 0004 and 0005 added, undone in the order SQLite needs (an index before its column).
_AFTER_0003 = (
    "DROP INDEX idempotency_keys_by_key",
    "ALTER TABLE idempotency_keys DROP COLUMN path",
    "DROP INDEX charges_by_customer",
    "ALTER TABLE customers DROP COLUMN description",
)


def as_revision_0003(path: Path, version_table: str) -> None:
    """A file written by this release turned into one the release at revision 0003 left: the store's
    rows are the same (keys, fingerprints and answers were computed then as now) but for the columns
    added since, and Alembic's stamp says 0003."""
    conn = sqlite3.connect(path, isolation_level=None)
    try:
        for statement in _AFTER_0003:
            conn.execute(statement)
        conn.execute(f"UPDATE {version_table} SET version_num = '0003'")
    finally:
        conn.close()
