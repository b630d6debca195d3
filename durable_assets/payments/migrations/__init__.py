"""The payments store's tables, versioned by Alembic (revisions in ``versions/``, version table
``payments_alembic_version``), apart from the store's queries, which stay plain ``sqlite3``.

The store opens at every process start, also in processes that load neither Dagster nor the kit
(the simulator): a file already at :data:`HEAD` is recognised with the store's own connection, and
the kit and Alembic load only when there is something to upgrade. A new revision moves ``HEAD``.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path

VERSION_TABLE = "payments_alembic_version"
HEAD = "0003"


def upgrade(conn: sqlite3.Connection, path: str) -> None:
    """Bring the store file at ``path`` (open on ``conn``) to :data:`HEAD`."""
    try:
        at_head = conn.execute(f"SELECT version_num FROM {VERSION_TABLE}").fetchall() == [(HEAD,)]
    except sqlite3.OperationalError:  # no version table: a new file, or one from before Alembic
        at_head = False
    if not at_head:
        from durable_assets.kit import Migrations

        Migrations(Path(__file__).resolve().parent, version_table=VERSION_TABLE, head=HEAD).upgrade(path)
