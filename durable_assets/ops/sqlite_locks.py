"""A frozen process holding a SQLite write lock must not hang every command of the instance.

SQLite's write lock belongs to the process, not to a lease: a worker stopped (SIGSTOP, a debugger,
a host suspended) inside a write transaction keeps every other writer of that file waiting. Our
tables wait up to 60 s per statement (``kit/db.py``), Dagster's up to 30 s per statement and, when
it opens its event log, retries that ten times; so `job resume` of a batch whose worker froze
inside a transaction waited minutes, one lapsed lease away from taking over (#23 item 8).

So before `job run`/`job resume` open a SQLite instance, every database file of it is probed for
its write lock (``BEGIN IMMEDIATE``, rolled back at once; readers are never blocked in WAL mode).
A lock a live writer holds is released within milliseconds; one still held after
:data:`LOCK_WAIT_S` is a stuck process, which is named (its pid, from ``/proc/locks``) in a
:class:`DatabaseLockedError` (exit 3) instead of a hang. A process frozen *outside* a transaction
holds no lock, and its batch is taken over once its lease lapses, as for a dead worker.
"""

from __future__ import annotations

import os
import sqlite3
import time
from pathlib import Path

from durable_assets.errors import DatabaseLockedError

#: How long a file may stay write-locked before the holder counts as stuck: far beyond any healthy
#: transaction of ours (a group commit of 200 answers takes milliseconds), far below the minutes a
#: frozen holder would cost.
LOCK_WAIT_S = 20.0
_POLL_S = 0.1


def database_files(home: Path) -> list[Path]:
    """Every SQLite file of a SQLite instance (our tables, Dagster's runs, index and event logs)."""
    return sorted(p for p in home.rglob("*.db") if p.is_file())


def wait_for_write_locks(home: Path, wait_s: float = LOCK_WAIT_S) -> None:
    """Return once no file of ``home`` is write-locked, or raise :class:`DatabaseLockedError`
    naming the file and its holder when one stays locked for ``wait_s`` seconds."""
    locked = [p for p in database_files(home) if _locked(p)]
    deadline = time.monotonic() + wait_s
    while locked:
        if time.monotonic() >= deadline:
            path = locked[0]
            holder = lock_holder(path)
            who = f"process {holder}" if holder is not None else "another process"
            raise DatabaseLockedError(
                f"database {path} has been locked by {who} for {wait_s:.0f} s (a frozen or stuck "
                f"worker holds its write lock); resume it (kill -CONT {holder or 'PID'}) or stop it "
                "(kill -9), then run the command again"
            )
        time.sleep(_POLL_S)  # a live writer's transaction ends within milliseconds; look again
        locked = [p for p in locked if _locked(p)]


def _locked(path: Path) -> bool:
    try:
        conn = sqlite3.connect(str(path), timeout=0, isolation_level=None)
    except sqlite3.Error:
        return False  # not a database we can open: whoever reads it reports that, not us
    try:
        conn.execute("BEGIN IMMEDIATE")
        conn.execute("ROLLBACK")
        return False
    except sqlite3.OperationalError as exc:
        return "locked" in str(exc) or "busy" in str(exc)
    finally:
        conn.close()


def lock_holder(path: Path) -> int | None:
    """The pid holding a POSIX write lock on ``path`` or its WAL index (Linux ``/proc/locks``)."""
    inodes = set()
    for candidate in (path, path.with_name(path.name + "-shm"), path.with_name(path.name + "-wal")):
        try:
            inodes.add(os.stat(candidate).st_ino)
        except OSError:
            continue
    try:
        lines = Path("/proc/locks").read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        fields = line.split()
        # "1: POSIX  ADVISORY  WRITE 4242 08:01:1234 0 EOF" (a blocked waiter's line starts "->")
        if len(fields) >= 6 and fields[1] == "POSIX" and fields[3] == "WRITE" and fields[0] != "->":
            inode = int(fields[5].rsplit(":", 1)[-1])
            if inode in inodes and int(fields[4]) != os.getpid():
                return int(fields[4])
    return None
