"""A versioned schema of your own: your Alembic revisions, your version table, the kit's machinery.

``CREATE TABLE IF NOT EXISTS`` cannot alter a table and records nothing of what a database holds,
so a column added in a later release would never reach an existing file. Every table we own is
therefore versioned by Alembic, each history with its own version table, so several histories
(the kit's, a provider's, a pipeline's) can share one database without mixing. They share the
kit's ``env.py`` and revision template: a history is only its folder of revisions.

Opening a database already at head happens at every process start, so it stays cheap: the version
row is read with plain SQL (``sqlite3`` for a file, which loads neither SQLAlchemy nor Alembic) and
compared with the declared head; Alembic is imported only when there is something to upgrade.
"""

from __future__ import annotations

import functools
import os
import sqlite3
import threading
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from durable_assets.errors import DurableError

if TYPE_CHECKING:  # loaded only to upgrade: a database at head needs neither
    import sqlalchemy as sa
    from alembic.config import Config
    from alembic.script import ScriptDirectory
    from sqlalchemy.engine import Connection, Engine

#: The kit's migrations folder: the ``env.py`` and ``script.py.mako`` every history runs with.
_SHARED_ENV = Path(__file__).resolve().parent / "migrations"
# Alembic's ``context`` proxy is module-global: two threads of one process must not run env.py at once.
_env_lock = threading.Lock()


class SchemaTooNewError(DurableError):
    """The database was upgraded by a newer release; this one cannot know what its revisions did."""


@dataclass(frozen=True)
class Migrations:
    """One schema history: the revisions in ``script_location/versions`` and the table recording
    which of them a database has (``version_table``, unique per history within a database).

    ``head`` is the newest revision, declared so that a database already there is recognised
    without loading Alembic; an upgrade checks it against the revisions and fails loudly when a
    new revision was added without moving it. ``target_metadata`` and ``include_name`` serve
    ``alembic revision --autogenerate`` only. ``lock_key`` is the Postgres advisory lock that
    serialises upgrades across processes (by default one derived from ``version_table``).
    """

    script_location: Path
    version_table: str
    head: str
    target_metadata: sa.MetaData | None = None
    include_name: Callable[[str | None, str, Any], bool] | None = None
    lock_key: int | None = None

    def upgrade(self, target: str | Path | Engine) -> None:
        """Bring a database to head: a SQLite file's path, a database URL, or an engine.

        One transaction that no other process can interleave with: on Postgres an advisory lock,
        on SQLite ``BEGIN IMMEDIATE`` (the file's write lock, taken before any DDL). Both roll DDL
        back with the transaction, so a crash mid-upgrade leaves the database as it was.
        """
        if not isinstance(target, str | os.PathLike):
            self._upgrade_engine(target)
            return
        url = os.fspath(target)
        if "://" not in url:
            if self._file_at_head(Path(url)):
                return
            url = f"sqlite:///{url}"
        engine = _engine(url)
        try:
            self._upgrade_engine(engine)
        finally:
            engine.dispose()

    def current(self, connection: Connection) -> str | None:
        """The revision the database is at; None when this history never ran on it."""
        import sqlalchemy as sa

        if not sa.inspect(connection).has_table(self.version_table):
            return None
        found = connection.execute(sa.text(f"SELECT version_num FROM {self.version_table}")).scalar()
        return None if found is None else str(found)

    def config(self, connection: Connection | None = None) -> Config:
        """An Alembic config that needs no alembic.ini (it works from an installed package); also
        for writing a revision: ``alembic.command.revision(m.config(), "why", rev_id="0002")``."""
        from alembic.config import Config

        cfg = Config()
        cfg.set_main_option("script_location", str(_SHARED_ENV))
        cfg.set_main_option("path_separator", "os")
        cfg.set_main_option("version_locations", str(Path(self.script_location) / "versions"))
        # Valid module names, so ruff and mypy check revisions like any other module.
        cfg.set_main_option("file_template", "r%%(rev)s_%%(slug)s")
        cfg.attributes["migrations"] = self
        if connection is not None:
            cfg.attributes["connection"] = connection
        return cfg

    @functools.cached_property
    def script(self) -> ScriptDirectory:
        """The revisions, read once per process: they are files of a package and do not change under it."""
        from alembic.script import ScriptDirectory

        return ScriptDirectory.from_config(self.config())

    def _file_at_head(self, path: Path) -> bool:
        if not path.is_file():
            return False
        conn = sqlite3.connect(path, timeout=60)
        try:
            row = conn.execute(f"SELECT version_num FROM {self.version_table}").fetchone()
        except sqlite3.OperationalError:  # no version table: never versioned by this history
            return False
        finally:
            conn.close()
        return row is not None and row[0] == self.head

    def _engine_at_head(self, engine: Engine) -> bool:
        """The version row, read outside any transaction: a read takes no lock, so opening a
        database already at head (every open but the first) never waits on a writer, even one
        frozen mid-transaction (SIGSTOP), which the write lock of the upgrade below would wait on
        until its busy timeout."""
        raw = engine.raw_connection()
        try:
            cursor = raw.cursor()
            try:
                cursor.execute(f"SELECT version_num FROM {self.version_table}")
                row = cursor.fetchone()
            except engine.dialect.loaded_dbapi.Error:  # no version table: never versioned here
                return False
            finally:
                cursor.close()
            return row is not None and row[0] == self.head
        finally:
            raw.close()  # back to the pool, which rolls back whatever the driver opened

    def _upgrade_engine(self, engine: Engine) -> None:
        import sqlalchemy as sa

        if self._engine_at_head(engine):
            return
        with _env_lock, engine.begin() as conn:
            if conn.dialect.name == "postgresql":
                key = self.lock_key if self.lock_key is not None else zlib.crc32(self.version_table.encode())
                conn.execute(sa.text("SELECT pg_advisory_xact_lock(:key)"), {"key": key})
            current = self.current(conn)
            if current != self.head:
                self._upgrade_from(conn, current)

    def _upgrade_from(self, conn: Connection, current: str | None) -> None:
        from alembic import command

        newest = self.script.get_current_head()
        if newest != self.head:
            raise RuntimeError(
                f"{self.script_location}: the newest revision is {newest} but head={self.head!r} is "
                "declared; move head to the newest revision"
            )
        if current is not None and current not in {r.revision for r in self.script.walk_revisions()}:
            where = conn.engine.url.render_as_string(hide_password=True)
            raise SchemaTooNewError(
                f"the tables {self.version_table} versions in {where} are at schema revision {current}, "
                f"which this release does not know (its newest is {self.head}): a newer release has upgraded "
                "them. Run that release, or restore a backup taken before it ran."
            )
        command.upgrade(self.config(conn), "head")


def _engine(url: str) -> Engine:
    """A one-off engine for the upgrade; on SQLite its transactions take the write lock first."""
    import sqlalchemy as sa
    from sqlalchemy.pool import NullPool

    if not url.startswith("sqlite"):
        # dagster-postgres ships psycopg2; SQLAlchemy 2.1 would otherwise pick psycopg 3.
        return sa.create_engine(url.replace("postgresql://", "postgresql+psycopg2://", 1), poolclass=NullPool)
    engine = sa.create_engine(url, connect_args={"timeout": 60}, poolclass=NullPool)

    @sa.event.listens_for(engine, "connect")
    def _autocommit_driver(dbapi_conn: Any, _record: Any) -> None:
        dbapi_conn.isolation_level = None  # the BEGIN below owns the transaction

    @sa.event.listens_for(engine, "begin")
    def _write_lock_first(conn: Connection) -> None:
        conn.exec_driver_sql("BEGIN IMMEDIATE")

    return engine
