"""Customer notices: the outbox's delivery side.

The mail transport here is a file-backed mailbox inside the instance (a stand-in for an email API),
so tests can count deliveries from outside the worker process. It deduplicates on the message id
the way mail systems do on ``Message-ID``: a re-send after a crash between send and record is
absorbed, and counted, instead of reaching the customer twice.

A notice is answered only once it is committed (fsync'd), as a mail API answers only once it
has the message. One transaction per notice made the 16 sending threads queue on one fsync each
(a third of a 1,000-invoice batch's busy samples, docs/benchmarks.md): concurrent notices now share
one transaction through the provider store's :class:`GroupWriter`, each in its own savepoint, and
none returns before that commit.
"""

from __future__ import annotations

import sqlite3
import threading
import time
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any

from durable_assets.kit import enable_wal
from durable_assets.payments.group_write import GroupWriter, locked_transaction
from durable_assets.refunds.migrations import MAILBOX_SCHEMA


class Mailbox:
    def __init__(self, path: str | Path) -> None:
        self.path = str(path)
        self._lock = threading.Lock()
        self._conn = sqlite3.connect(self.path, timeout=60, isolation_level=None, check_same_thread=False)
        enable_wal(self._conn)
        self._conn.execute("PRAGMA busy_timeout=60000")
        MAILBOX_SCHEMA.upgrade(self.path)
        self._writer = GroupWriter(self._transaction)

    def _transaction(self, begin: str) -> AbstractContextManager[sqlite3.Connection]:
        return locked_transaction(self._lock, self._conn, begin)

    def close(self) -> None:
        self._conn.close()

    def send(self, *, message_id: str, recipient: str, subject: str, body: str) -> dict[str, Any]:
        def deliver(conn: sqlite3.Connection) -> bool:
            inserted = conn.execute(
                "INSERT OR IGNORE INTO messages VALUES (?, ?, ?, ?, ?)",
                (message_id, recipient, subject, body, time.time()),
            ).rowcount
            counter = "delivered" if inserted else "duplicates_suppressed"
            conn.execute(
                "INSERT INTO counters VALUES (?, 1) ON CONFLICT(name) DO UPDATE SET value = value + 1",
                (counter,),
            )
            return bool(inserted)

        inserted = self._writer.write(deliver)  # returns once its group's transaction is committed
        return {"message_id": message_id, "recipient": recipient, "duplicate": not inserted}

    def count(self, recipient: str | None = None) -> int:
        with self._lock:
            conn = self._conn
            if recipient is None:
                return int(conn.execute("SELECT COUNT(*) FROM messages").fetchone()[0])
            return int(
                conn.execute("SELECT COUNT(*) FROM messages WHERE recipient=?", (recipient,)).fetchone()[0]
            )

    def counters(self) -> dict[str, int]:
        with self._lock:
            return {name: int(v) for name, v in self._conn.execute("SELECT name, value FROM counters")}
