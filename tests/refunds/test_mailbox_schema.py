"""The customer mailbox under Alembic: a file from before versioning is adopted with its messages,
and a file at head opens without loading Alembic."""

from __future__ import annotations

import sqlite3
from pathlib import Path

from durable_assets.refunds.migrations import MAILBOX_SCHEMA
from durable_assets.refunds.notices import Mailbox
from tests.support.imports import libraries_loaded_by

#: The tables as the mailbox made them before it was versioned (``CREATE TABLE IF NOT EXISTS``).
_UNVERSIONED = (
    "CREATE TABLE messages (message_id TEXT PRIMARY KEY, recipient TEXT NOT NULL,"
    " subject TEXT NOT NULL, body TEXT NOT NULL, sent_at REAL NOT NULL)",
    "CREATE TABLE counters (name TEXT PRIMARY KEY, value INTEGER NOT NULL)",
    "INSERT INTO messages VALUES ('m-old', 'old@example.com', 'Your refund', 'body', 1.0)",
    "INSERT INTO counters VALUES ('delivered', 1)",
)


def _stamped(path: Path) -> list[tuple[str]]:
    conn = sqlite3.connect(path)
    try:
        return conn.execute(f"SELECT version_num FROM {MAILBOX_SCHEMA.version_table}").fetchall()
    finally:
        conn.close()


def test_a_mailbox_from_before_versioning_is_adopted_with_its_messages(tmp_path: Path) -> None:
    path = tmp_path / "mailbox.db"
    with sqlite3.connect(path) as conn:
        for statement in _UNVERSIONED:
            conn.execute(statement)
    conn.close()

    mailbox = Mailbox(path)
    try:
        again = mailbox.send(message_id="m-old", recipient="old@example.com", subject="Your refund", body="b")
        mailbox.send(message_id="m-new", recipient="new@example.com", subject="Your refund", body="b")
        assert again["duplicate"] is True  # the adopted message still deduplicates a re-send
        assert mailbox.count() == 2 and mailbox.count("old@example.com") == 1
        assert mailbox.counters() == {"delivered": 2, "duplicates_suppressed": 1}
    finally:
        mailbox.close()
    assert _stamped(path) == [(MAILBOX_SCHEMA.head,)]


def test_a_mailbox_at_head_opens_without_alembic(tmp_path: Path) -> None:
    at_head = tmp_path / "head.db"
    Mailbox(at_head).close()
    open_ = "from durable_assets.refunds.notices import Mailbox; Mailbox({path!r}).close()"

    fast = libraries_loaded_by(open_.format(path=str(at_head)))
    upgrading = libraries_loaded_by(open_.format(path=str(tmp_path / "new.db")))

    assert _stamped(at_head) == [(MAILBOX_SCHEMA.head,)]
    assert fast & {"alembic", "sqlalchemy", "dagster"} == set()
    assert "alembic" in upgrading  # the probe sees it when an upgrade runs


def test_head_is_the_newest_revision() -> None:
    assert MAILBOX_SCHEMA.script.get_heads() == [MAILBOX_SCHEMA.head]
