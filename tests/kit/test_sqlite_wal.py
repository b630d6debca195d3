"""Switching to WAL while another process holds the file's write lock.

SQLite answers that switch with "database is locked" at once, without its busy timeout: the cause
of a CI failure where one of four processes opening a fresh ``durable.db`` together failed.
"""

from __future__ import annotations

import sqlite3
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from durable_assets.kit.sqlite_wal import enable_wal
from tests.support.machine import scaled


@contextmanager
def _writer_holding_the_lock(path: Path) -> Iterator[sqlite3.Connection]:
    """A connection mid-transaction on a rollback-journal file, as a process upgrading it is."""
    writer = sqlite3.connect(path, isolation_level=None)
    writer.execute("CREATE TABLE IF NOT EXISTS t (x)")
    writer.execute("BEGIN IMMEDIATE")
    writer.execute("INSERT INTO t VALUES (1)")
    try:
        yield writer
    finally:
        writer.close()


class _CountingConnection(sqlite3.Connection):
    """Counts the switch attempts, so the test knows a retry happened without sleeping."""

    attempts = 0

    def execute(self, sql: str, *args: Any) -> sqlite3.Cursor:
        if "journal_mode" in sql:
            type(self).attempts += 1
        return super().execute(sql, *args)


def test_sqlite_refuses_the_switch_at_once_however_long_the_busy_timeout(tmp_path: Path) -> None:
    """Why enable_wal exists: the plain pragma does not wait, so a timeout alone cannot help."""
    with _writer_holding_the_lock(tmp_path / "f.db"):
        reader = sqlite3.connect(tmp_path / "f.db", timeout=30, isolation_level=None)
        started = time.monotonic()
        with pytest.raises(sqlite3.OperationalError, match="locked"):
            reader.execute("PRAGMA journal_mode=WAL")
        assert time.monotonic() - started < 10
        reader.close()


def test_the_switch_waits_for_the_writer_and_then_happens(tmp_path: Path) -> None:
    path = tmp_path / "f.db"
    conn = sqlite3.connect(path, isolation_level=None, factory=_CountingConnection, check_same_thread=False)
    _CountingConnection.attempts = 0
    result: list[str] = []
    with _writer_holding_the_lock(path) as writer:
        switching = threading.Thread(target=lambda: result.append(enable_wal(conn, timeout_s=60)))
        switching.start()
        deadline = time.monotonic() + scaled(30)
        while _CountingConnection.attempts < 2:  # refused at least once, then tried again
            assert time.monotonic() < deadline, "enable_wal never retried"
            time.sleep(0.005)
        assert switching.is_alive() and result == []
        writer.execute("COMMIT")
        switching.join(timeout=scaled(60))
    assert result == ["wal"]
    assert sqlite3.connect(path).execute("PRAGMA journal_mode").fetchone() == ("wal",)


def test_the_switch_gives_up_with_the_lock_error_after_its_timeout(tmp_path: Path) -> None:
    with _writer_holding_the_lock(tmp_path / "f.db"):
        conn = sqlite3.connect(tmp_path / "f.db", isolation_level=None)
        with pytest.raises(sqlite3.OperationalError, match="locked"):
            enable_wal(conn, timeout_s=0.05)


def test_a_file_already_in_wal_needs_no_lock(tmp_path: Path) -> None:
    path = tmp_path / "f.db"
    assert enable_wal(sqlite3.connect(path, isolation_level=None)) == "wal"
    assert enable_wal(sqlite3.connect(path, isolation_level=None), timeout_s=0) == "wal"
