"""A full disk under the instance: recognised for what it is, and no obstacle to reading a batch's state.

A full filesystem reaches us in several disguises: ``OSError`` ENOSPC from a step output or the
batch log, SQLite's "database or disk is full" from a write, and SQLite's "disk I/O error" from a
mere *read*: a WAL database whose ``-shm`` index was removed when its last connection closed needs a
new 32 KiB one before it can be read, and a full filesystem cannot give it. The first two always
mean a full disk; the third only when the filesystem really has (almost) no space left, which is
checked, so a damaged file is never reported as a full disk.

Reading on a full disk: :func:`reading_when_full` retries a read-only command with every new
SQLite connection opened so that it needs no new file. A database whose WAL is empty (its last
writer checkpointed it) holds every commit in its main file and is read as ``immutable`` (no lock,
no index); one whose WAL still holds commits is read the ordinary way when its index exists, else
with ``PRAGMA locking_mode=EXCLUSIVE``, under which SQLite keeps the index in memory (one
connection at a time then; nothing can write to a full disk meanwhile anyway).
"""

from __future__ import annotations

import errno
import logging
import os
import re
import sqlite3
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import quote

import sqlalchemy as sa

from durable_assets.errors import DiskFullError, UnknownBatchError

T = TypeVar("T")
logger = logging.getLogger(__name__)

#: What SQLite and the OS say when a write found no space: a full disk whatever else is true.
_FULL_TEXTS = ("database or disk is full", "no space left on device", "[errno 28]")
#: What SQLite says when it could not create or grow a file it needs even to read (the WAL index):
#: a full disk only if the filesystem is (nearly) full, see :func:`filesystem_full`.
_IO_TEXT = "disk i/o error"
#: Below this many free bytes a filesystem counts as full: SQLite's WAL index alone needs 32 KiB, a
#: step output or a batch of events far more.
FULL_BELOW_BYTES = 1 << 20
_QUOTED_PATH = re.compile(r"No space left on device: '([^']+)'")


def filesystem_full(path: Path) -> bool:
    """True when the filesystem holding ``path`` (or its nearest existing ancestor) is nearly full."""
    existing = next((p for p in (path, *path.parents) if p.exists()), None)
    if existing is None:
        return False
    try:
        st = os.statvfs(existing)
    except OSError:
        return False
    return st.f_bavail * st.f_frsize < FULL_BELOW_BYTES


def _chain(exc: BaseException) -> Iterable[BaseException]:
    seen: set[int] = set()
    todo: list[BaseException] = [exc]
    while todo:
        current = todo.pop()
        if id(current) in seen:
            continue
        seen.add(id(current))
        yield current
        todo += [e for e in (current.__cause__, current.__context__) if e is not None]
        original = getattr(current, "original_exc_info", None)  # Dagster's user-code wrapper
        if original and isinstance(original[1], BaseException):
            todo.append(original[1])


def full_path_of_error(exc: BaseException, home: Path) -> str | None:
    """The path to name if ``exc`` (or anything in its cause chain) is the disk running full: the
    file the OS names, else the instance directory ``home``; None when it is something else."""
    for e in _chain(exc):
        if isinstance(e, OSError) and e.errno == errno.ENOSPC:
            return str(e.filename or home)
        if (
            isinstance(e, (sqlite3.OperationalError, sa.exc.OperationalError))
            or "sqlite" in type(e).__module__
        ):
            path = full_path_of_reason(str(e), home)
            if path is not None:
                return path
    return None


def full_path_of_reason(text: str, home: Path) -> str | None:
    """The same for an error recorded as text (a step failure's reason in the event log)."""
    lowered = text.lower()
    if any(t in lowered for t in _FULL_TEXTS):
        quoted = _QUOTED_PATH.search(text)
        return quoted.group(1) if quoted else str(home)
    if _IO_TEXT in lowered and filesystem_full(home):
        return str(home)
    return None


def batch_disk_full(batch_id: str, path: str, step: int | None) -> DiskFullError:
    """The documented line: ``batch X failed at step N: disk full (PATH); free space and run ...``."""
    where = f" at step {step}" if step else ""
    return DiskFullError(
        f"batch {batch_id} failed{where}: disk full ({path}); free space and run job resume --id {batch_id}",
        path=path,
    )


#: SQLite's WAL index of a small WAL (it grows in 32 KiB pieces).
_WAL_INDEX_BYTES = 32 * 1024
_reading_on = False


def _connect_for_reading(_dialect: Any, _record: Any, cargs: list[Any], cparams: dict[str, Any]) -> Any:
    """How to open one SQLite file for reading on a full disk (see the module docstring)."""
    path = str(cargs[0]) if cargs else str(cparams.get("database", ""))
    if not path or path == ":memory:" or path.startswith("file:") or not os.path.exists(path):
        return None
    wal, index = Path(path + "-wal"), Path(path + "-shm")
    if not wal.exists() or wal.stat().st_size == 0:
        # Everything committed is in the file itself: read it as immutable (no lock, no index).
        cargs[:1] = [f"file:{quote(os.path.abspath(path))}?immutable=1"]
        cparams["uri"] = True
        return None
    if index.exists() and index.stat().st_size >= _WAL_INDEX_BYTES:
        return None  # a live or crashed writer left the index: the ordinary way needs no new space
    # Commits only in the WAL and no index for them: one connection holding the index in memory.
    conn = sqlite3.connect(path, **cparams)
    conn.execute("PRAGMA locking_mode=EXCLUSIVE")
    return conn


def read_without_wal_index() -> None:
    """From now on, every new SQLite connection of this process (Dagster's and ours) is opened
    so that reading needs no new disk space (see the module docstring). For the rest of a command
    that found the disk full: our pooled connections are closed, so none is reused."""
    global _reading_on
    if _reading_on:
        return
    sa.event.listen(sa.engine.Engine, "do_connect", _connect_for_reading)
    _reading_on = True
    from durable_assets.kit.runtime import dispose_engines

    dispose_engines()


def reading_when_full(read: Callable[[], T], home: Callable[[], Path]) -> T:
    """``read()``; if it failed because the disk is full, once more without WAL indexes, so that
    ``job status`` and ``job list`` answer when nothing can be written."""
    try:
        return read()
    except Exception as exc:
        if full_path_of_error(exc, home()) is None:
            raise
    read_without_wal_index()
    try:
        return read()
    except Exception as exc:
        path = full_path_of_error(exc, home())
        if path is None:
            raise
        raise DiskFullError(
            f"disk full ({path}): even reading the instance needs space here; free some and try again",
            path=path,
        ) from exc


@contextmanager
def full_disk_ends_batch(
    batch_id: str, home: Path, step_now: Callable[[], int | None], log: Path
) -> Iterator[None]:
    """Turn a full disk while this process runs batch ``batch_id`` into the documented one-line
    error, with the step that was running (read without WAL indexes) and a copy in the batch log
    when even a line still fits there."""
    try:
        yield
    except DiskFullError as exc:
        append_to_log(log, f"error: {exc}")
        raise
    except Exception as exc:
        path = full_path_of_error(exc, home)
        if path is None:
            raise
        read_without_wal_index()
        step: int | None = None
        try:
            step = step_now()
        except UnknownBatchError:  # `job run` found the disk full before the batch existed
            error = DiskFullError(
                f"disk full ({path}): batch {batch_id} was not created; free space and run the command again",
                path=path,
            )
            raise error from exc
        except Exception:  # the error line matters more than its step number
            logger.debug("the step of batch %s is unreadable on the full disk", batch_id, exc_info=True)
        error = batch_disk_full(batch_id, path, step)
        if step is None:  # every step completed: nothing failed, the disk stopped us before it began
            error = DiskFullError(
                f"disk full ({path}) before batch {batch_id} could continue; free space and run "
                f"job resume --id {batch_id}",
                path=path,
            )
        append_to_log(log, f"error: {error}")
        raise error from exc


def append_to_log(log: Path, line: str) -> None:
    """Best effort: a full disk often still has room in the log file's last, partly used block."""
    with suppress(OSError):
        fd = os.open(log, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, (line + "\n").encode())
        finally:
            os.close(fd)
