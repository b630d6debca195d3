"""Reads of our tables on SQLite take no write lock, so status, leases and the HTTP API see past a
writer frozen mid-transaction (SIGSTOP keeps its lock) instead of waiting out the busy timeout."""

from __future__ import annotations

import sqlite3
import subprocess
import sys
import time
from pathlib import Path

from durable_assets.kit.db import DurableDatabase
from durable_assets.kit.leases import LeaseStore
from tests.support.machine import scaled


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


def test_opening_a_database_at_head_does_not_wait_on_a_writer(tmp_path: Path) -> None:
    """A new process opening the instance (a `job status`, a test's reader) while a frozen worker
    holds the write lock: the schema is already at head, so the open reads its version and goes on."""
    path = tmp_path / "durable.db"
    url = f"sqlite:///{path}"
    LeaseStore(DurableDatabase(url)).acquire("b1", "run-1")  # creates the tables, at head
    probe = (
        "import sys\n"
        "from durable_assets.kit.db import DurableDatabase\n"
        "from durable_assets.kit.leases import LeaseStore\n"
        "print(LeaseStore(DurableDatabase(sys.argv[1])).get('b1').run_id)\n"
    )
    writer = sqlite3.connect(path, isolation_level=None, timeout=0)
    writer.execute("BEGIN IMMEDIATE")
    try:
        opened = subprocess.run(
            [sys.executable, "-c", probe, url], capture_output=True, text=True, timeout=scaled(120)
        )
    finally:
        writer.execute("ROLLBACK")
        writer.close()
    assert opened.returncode == 0 and opened.stdout.strip() == "run-1", opened.stderr[-2000:]
