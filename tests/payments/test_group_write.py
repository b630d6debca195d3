"""The provider's file groups concurrent writes into one transaction without mixing their fates."""

from __future__ import annotations

import sqlite3
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path

import pytest

from durable_assets.payments.group_write import GroupWriter
from durable_assets.payments.store import PaymentStore


class _File:
    """A SQLite file with one table and the store's way of opening a transaction."""

    def __init__(self, path: Path) -> None:
        self.conn = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
        self.conn.execute("CREATE TABLE t (n INTEGER PRIMARY KEY)")
        self.lock = threading.Lock()
        self.fail_commit = False

    @contextmanager
    def transaction(self, begin: str) -> Iterator[sqlite3.Connection]:
        with self.lock:
            self.conn.execute(begin)
            try:
                yield self.conn
                if self.fail_commit:
                    raise sqlite3.OperationalError("disk I/O error")
                self.conn.execute("COMMIT")
            except BaseException:
                if self.conn.in_transaction:
                    self.conn.execute("ROLLBACK")
                raise

    def rows(self) -> list[int]:
        return [n for (n,) in self.conn.execute("SELECT n FROM t ORDER BY n")]


@pytest.fixture
def file(tmp_path: Path) -> _File:
    return _File(tmp_path / "f.db")


def test_concurrent_writes_share_commits(file: _File) -> None:
    writer = GroupWriter(file.transaction)
    first_inside = threading.Event()
    release = threading.Event()

    def insert(n: int) -> int:
        def work(conn: sqlite3.Connection) -> int:
            if n == 0:  # hold the first transaction open until the others have queued behind it
                first_inside.set()
                release.wait(10)
            conn.execute("INSERT INTO t VALUES (?)", (n,))
            return n

        return writer.write(work)

    with ThreadPoolExecutor(16) as pool:
        first = pool.submit(insert, 0)
        assert first_inside.wait(10)
        rest = [pool.submit(insert, n) for n in range(1, 40)]
        release.set()
        answers = [first.result(), *(f.result() for f in rest)]
    assert answers == list(range(40))
    assert file.rows() == list(range(40))
    assert writer.commits < 40  # the 39 queued behind the first went in far fewer transactions


def test_one_failing_write_undoes_only_its_own_rows(file: _File) -> None:
    writer = GroupWriter(file.transaction)
    gate = threading.Event()
    started = threading.Event()

    def hold(conn: sqlite3.Connection) -> None:
        started.set()
        gate.wait(10)
        conn.execute("INSERT INTO t VALUES (100)")

    def good(n: int) -> None:
        writer.write(lambda conn: conn.execute("INSERT INTO t VALUES (?)", (n,)))

    def bad(conn: sqlite3.Connection) -> None:
        conn.execute("INSERT INTO t VALUES (200)")
        raise ValueError("invalid request")

    with ThreadPoolExecutor(4) as pool:
        leader = pool.submit(writer.write, hold)
        assert started.wait(10)
        group = [pool.submit(good, 1), pool.submit(writer.write, bad), pool.submit(good, 2)]
        gate.set()
        leader.result()
        group[0].result()
        group[2].result()
        with pytest.raises(ValueError, match="invalid request"):
            group[1].result()
    assert file.rows() == [1, 2, 100]


def test_a_failed_commit_fails_every_write_of_the_group(file: _File) -> None:
    writer = GroupWriter(file.transaction)
    file.fail_commit = True
    with pytest.raises(sqlite3.OperationalError, match="disk I/O"):
        writer.write(lambda conn: conn.execute("INSERT INTO t VALUES (1)"))
    file.fail_commit = False
    assert file.rows() == []
    writer.write(lambda conn: conn.execute("INSERT INTO t VALUES (2)"))
    assert file.rows() == [2]


def test_the_store_creates_concurrent_charges_exactly_once_each(tmp_path: Path) -> None:
    """Through the store: 200 charges from 16 threads, each key once, with fewer commits than charges."""
    with PaymentStore(str(tmp_path / "p.db")) as store:

        def charge(i: int) -> str:
            made = store.create_charge(amount=100 + i, currency="usd", idempotency_key=f"ch-{i}")
            again = store.create_charge(amount=100 + i, currency="usd", idempotency_key=f"ch-{i}")
            assert again.replayed and again.body["id"] == made.body["id"]
            return str(made.body["id"])

        with ThreadPoolExecutor(16) as pool:
            ids = list(pool.map(charge, range(200)))
        assert len(set(ids)) == 200
        assert store._writer.commits < 400
        count = store._conn.execute("SELECT count(*) FROM charges").fetchone()[0]
    assert count == 200
