"""The customer mailbox's tables (``notices.Mailbox``), versioned by Alembic with the kit's
:class:`Migrations`: revisions in ``versions/``, version table ``mailbox_alembic_version``.

A mailbox file from before versioning (its tables, no version table) is adopted by revision 0001,
which creates only what is missing, so its messages and counters stay.
"""

from __future__ import annotations

from pathlib import Path

from durable_assets.kit import Migrations

MAILBOX_SCHEMA = Migrations(
    Path(__file__).resolve().parent, version_table="mailbox_alembic_version", head="0001"
)
