"""Reads of our tables on SQLite take no write lock, so status, leases and the HTTP API see past a
writer frozen mid-transaction (SIGSTOP keeps its lock) instead of waiting out the busy timeout."""

from __future__ import annotations

import sqlite3
import time
from pathlib import Path

from durable_assets.kit.db import DurableDatabase
from durable_assets.kit.leases import LeaseStore


def test_a_read_does_not_wait_on_a_writer_holding_the_lock(tmp_path: Path) -> None:
    path = tmp_path / "durable.db"
    db = DurableDatabase(f"sqlite:///{path}")
    leases = LeaseStore(db)
    leases.acquire("b1", "run-1")
    writer = sqlite3.connect(path, isolation_level=None, timeout=0)
    writer.execute("BEGIN IMMEDIATE")  # what a frozen worker holds
    try:
        started = time.monotonic()
        lease = leases.get("b1")
        took = time.monotonic() - started
    finally:
        writer.execute("ROLLBACK")
        writer.close()
    assert lease is not None and lease.run_id == "run-1"
    assert took < 5, f"the read waited {took:.1f}s on the writer"


def test_a_write_still_takes_the_lock_at_its_start(tmp_path: Path) -> None:
    path = tmp_path / "durable.db"
    db = DurableDatabase(f"sqlite:///{path}")
    with db.transaction() as conn:
        other = sqlite3.connect(path, isolation_level=None, timeout=0)
        try:
            try:
                other.execute("BEGIN IMMEDIATE")
                took_lock = True
            except sqlite3.OperationalError:
                took_lock = False
        finally:
            other.close()
        conn.exec_driver_sql("SELECT 1")
    assert not took_lock, "a transaction() must hold the write lock from its BEGIN"
