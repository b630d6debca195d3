"""Switching a SQLite file to write-ahead logging when other processes may be opening it too.

``PRAGMA journal_mode=WAL`` needs the file's exclusive lock, and SQLite takes that lock without
consulting the busy timeout: a process opening a new file while another is switching it gets
"database is locked" at once, however long its timeout. Four processes opening a fresh
``durable.db`` together hit that about one time in five. So the switch is retried here, for as long
as the busy timeout every other statement waits.
"""

from __future__ import annotations

import sqlite3
import time

#: How long the switch is retried: the busy timeout the rest of our SQLite statements wait.
WAL_SWITCH_TIMEOUT_S = 60.0
_RETRY_EVERY_S = 0.01


def enable_wal(conn: sqlite3.Connection, timeout_s: float = WAL_SWITCH_TIMEOUT_S) -> str:
    """Put ``conn``'s file in WAL mode and return the journal mode it ends in (``"wal"``, or what
    the file system allows instead, e.g. ``"delete"`` on some network mounts: the caller decides
    whether that is an error)."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            row = conn.execute("PRAGMA journal_mode=WAL").fetchone()
        except sqlite3.OperationalError as error:
            if "locked" not in str(error) or time.monotonic() > deadline:
                raise
            time.sleep(_RETRY_EVERY_S)
            continue
        return str(row[0]).lower()
