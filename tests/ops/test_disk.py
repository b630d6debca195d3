"""ops/disk.py: what counts as a full disk, and reading SQLite without new files (#23 item 5).

The end-to-end behaviour (a real tmpfs filled mid-batch) is tests/crash/test_disk_full.py; here
the classification rules, and the read path against a WAL database whose index is gone.
"""

from __future__ import annotations

import errno
import sqlite3
from pathlib import Path

import pytest
import sqlalchemy as sa

from durable_assets.errors import DiskFullError, UnknownBatchError
from durable_assets.ops import disk


def test_enospc_names_the_file() -> None:
    exc = OSError(errno.ENOSPC, "No space left on device", "/data/home/storage/x")
    assert disk.full_path_of_error(exc, Path("/data/home")) == "/data/home/storage/x"


def test_sqlite_full_anywhere_in_the_chain_names_the_home() -> None:
    try:
        try:
            raise sqlite3.OperationalError("database or disk is full")
        except sqlite3.OperationalError as inner:
            raise RuntimeError("step failed") from inner
    except RuntimeError as outer:
        assert disk.full_path_of_error(outer, Path("/h")) == "/h"


def test_disk_io_error_is_a_full_disk_only_when_the_filesystem_is_full(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    exc = sa.exc.OperationalError("PRAGMA x", {}, sqlite3.OperationalError("disk I/O error"))
    monkeypatch.setattr(disk, "filesystem_full", lambda _p: False)
    assert disk.full_path_of_error(exc, tmp_path) is None  # a damaged file is not a full disk
    monkeypatch.setattr(disk, "filesystem_full", lambda _p: True)
    assert disk.full_path_of_error(exc, tmp_path) == str(tmp_path)


def test_other_errors_are_not_disk_full(tmp_path: Path) -> None:
    assert disk.full_path_of_error(OSError(errno.EACCES, "Permission denied", "/x"), tmp_path) is None
    assert disk.full_path_of_error(sqlite3.OperationalError("database is locked"), tmp_path) is None
    assert disk.full_path_of_reason(
        "OSError: [Errno 28] No space left on device: '/h/logs/b.log'", tmp_path
    ) == ("/h/logs/b.log")


def test_the_documented_line() -> None:
    assert str(disk.batch_disk_full("b1", "/h", 4)) == (
        "batch b1 failed at step 4: disk full (/h); free space and run job resume --id b1"
    )


def _wal_database(path: Path, *values: int, checkpoint: bool = True) -> sqlite3.Connection:
    """A WAL-mode database whose table ``t`` holds ``values``, committed; without ``checkpoint``
    the commits stay in the WAL only (as a worker killed before any checkpoint leaves them)."""
    conn = sqlite3.connect(path)
    conn.execute("PRAGMA journal_mode=WAL")
    if not checkpoint:
        conn.execute("PRAGMA wal_autocheckpoint=0")
    conn.execute("CREATE TABLE t (n INTEGER)")
    conn.executemany("INSERT INTO t VALUES (?)", [(v,) for v in values])
    conn.commit()
    return conn


def test_a_wal_database_without_its_index_is_read_as_immutable(tmp_path: Path) -> None:
    """What `job status` meets after a full disk: every commit checkpointed, WAL and index gone."""
    path = tmp_path / "runs.db"
    _wal_database(path, 1, 2).close()
    assert not Path(f"{path}-shm").exists()  # the last close removed the index
    cargs: list[object] = [str(path)]
    cparams: dict[str, object] = {}
    assert disk._connect_for_reading(None, None, cargs, cparams) is None
    assert cargs[0] == f"file:{path}?immutable=1" and cparams["uri"] is True
    reader = sqlite3.connect(str(cargs[0]), uri=True)
    assert reader.execute("SELECT count(*) FROM t").fetchone() == (2,)
    reader.close()
    assert not Path(f"{path}-shm").exists(), "reading created a WAL index"


def test_a_wal_with_commits_and_no_index_is_read_with_the_index_in_memory(tmp_path: Path) -> None:
    """A worker that died with commits only in the WAL, and no index left: they are read, not lost."""
    live = tmp_path / "live.db"
    writer = _wal_database(live, 7, checkpoint=False)
    path = tmp_path / "d.db"  # the files as the dead worker left them, minus the index
    path.write_bytes(live.read_bytes())
    Path(f"{path}-wal").write_bytes(Path(f"{live}-wal").read_bytes())
    writer.close()
    assert Path(f"{path}-wal").stat().st_size > 0 and not Path(f"{path}-shm").exists()
    conn = disk._connect_for_reading(None, None, [str(path)], {})
    assert conn is not None
    assert conn.execute("SELECT n FROM t").fetchone() == (7,)  # the table exists only in the WAL
    conn.close()


def _full(step_now: object, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, *, logged: bool = True) -> str:
    # Not in this process: it would change how every later test's SQLite connections open.
    monkeypatch.setattr(disk, "read_without_wal_index", lambda: None)
    log = tmp_path / "b.log"
    log.write_text("")
    with (
        pytest.raises(DiskFullError) as caught,
        disk.full_disk_ends_batch("b", tmp_path, step_now, log),  # type: ignore[arg-type]
    ):
        raise OSError(errno.ENOSPC, "No space left on device", str(tmp_path / "storage" / "x"))
    # The batch log gets the line when it fits (a batch that was never created has none).
    assert log.read_text() == (f"error: {caught.value}\n" if logged else "")
    return str(caught.value)


def test_full_disk_while_a_batch_runs_names_its_step(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    line = _full(lambda: 4, tmp_path, monkeypatch)
    assert (
        line
        == f"batch b failed at step 4: disk full ({tmp_path}/storage/x); free space and run job resume --id b"
    )


def test_full_disk_before_the_batch_existed_says_it_was_not_created(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def no_batch() -> int:
        raise UnknownBatchError("no batch")

    line = _full(no_batch, tmp_path, monkeypatch, logged=False)
    assert line.endswith("batch b was not created; free space and run the command again"), line


def test_full_disk_before_a_resume_began_blames_no_step(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    line = _full(lambda: None, tmp_path, monkeypatch)
    assert "failed" not in line and line.endswith("free space and run job resume --id b"), line
