"""The payments store's tables, versioned by Alembic with the kit's :class:`Migrations` (revisions
in ``versions/``, version table ``payments_alembic_version``), apart from the store's queries, which
stay plain ``sqlite3``.

Revisions 0001-0003 are the steps the store applied by ``PRAGMA user_version`` before (``legacy.py``),
so a file of any earlier release is adopted in place. The store opens at every process start, also
in processes without Dagster (the simulator): a file at head costs one query, and Alembic loads only
to upgrade. A new revision moves ``head``.
"""

from __future__ import annotations

from pathlib import Path

from durable_assets.kit import Migrations

STORE_SCHEMA = Migrations(
    Path(__file__).resolve().parent, version_table="payments_alembic_version", head="0005"
)
