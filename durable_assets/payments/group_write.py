"""Concurrent writes to the provider's file share one transaction, and so one fsync.

The store answers a charge or a refund only once it is on disk (``synchronous=FULL``: what a real
provider promises, that a returned object survives a power loss). One transaction per request
made 16 threads queue on one fsync each: the largest single cost of a whole demo batch (issue #25's
profile, docs/benchmarks.md). Here the first writer to arrive leads: it runs every write queued
meanwhile in one ``BEGIN IMMEDIATE`` transaction, each inside its own savepoint so that one
request's error undoes only its own writes, commits once, and only then does any of them return.
Nothing is answered before it is durable, so a crash at any instant loses only unanswered writes,
as before.
"""

from __future__ import annotations

import sqlite3
import threading
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

T = TypeVar("T")

Transaction = Callable[[str], AbstractContextManager[sqlite3.Connection]]


@contextmanager
def locked_transaction(
    lock: threading.Lock, conn: sqlite3.Connection, begin: str
) -> Iterator[sqlite3.Connection]:
    """One transaction (``begin``: ``BEGIN`` or ``BEGIN IMMEDIATE``) on a connection shared by
    threads, the ``lock`` keeping the others off it meanwhile: what a :class:`GroupWriter` leads.
    Any failure rolls back, a failed COMMIT (disk full) too, so the next BEGIN does not fail."""
    with lock:
        conn.execute(begin)
        try:
            yield conn
            conn.execute("COMMIT")
        except BaseException:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            raise


@dataclass
class _Write(Generic[T]):
    work: Callable[[sqlite3.Connection], T]
    result: T | None = None
    error: BaseException | None = None
    done: bool = False

    def outcome(self) -> T:
        if self.error is not None:
            raise self.error
        return self.result  # type: ignore[return-value]


class GroupWriter:
    """Runs write transactions for many threads, a group at a time (see the module docstring)."""

    def __init__(self, transaction: Transaction) -> None:
        self._transaction = transaction
        self._changed = threading.Condition()
        self._queue: list[_Write[Any]] = []
        self._leading = False
        #: Transactions committed (each may hold many writes); tests read it.
        self.commits = 0

    def write(self, work: Callable[[sqlite3.Connection], T]) -> T:
        """``work(conn)`` inside a write transaction; returns its result once that is committed."""
        mine: _Write[T] = _Write(work)
        with self._changed:
            self._queue.append(mine)
            while not mine.done and self._leading:
                self._changed.wait()
            if mine.done:
                return mine.outcome()
            self._leading = True
            group, self._queue = self._queue, []
        try:
            self._commit(group)
        finally:
            with self._changed:
                self._leading = False
                self._changed.notify_all()
        return mine.outcome()

    def _commit(self, group: list[_Write[Any]]) -> None:
        try:
            with self._transaction("BEGIN IMMEDIATE") as conn:
                for write in group:
                    _run_in_savepoint(conn, write)
            self.commits += 1
        except BaseException as exc:  # the transaction is gone: nothing of the group was written
            for write in group:
                write.error = write.error or exc
        finally:
            for write in group:
                write.done = True


def _run_in_savepoint(conn: sqlite3.Connection, write: _Write[Any]) -> None:
    """One request's writes, undone alone if it fails; an error that ended the whole transaction
    (SQLite rolls back by itself on e.g. a full disk) is raised, failing the group."""
    conn.execute("SAVEPOINT request")
    try:
        write.result = write.work(conn)
    except BaseException as exc:
        if not conn.in_transaction:
            raise
        write.error = exc
        conn.execute("ROLLBACK TO request")
    conn.execute("RELEASE request")
