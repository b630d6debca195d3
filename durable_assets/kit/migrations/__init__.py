"""Versioned migrations for the kit's own tables (never Dagster's).

``create_all`` only ever adds missing tables: it cannot alter one, and it leaves no record of which
schema a database has, so a column added to a table in a later release would silently never reach
an existing instance. Each change to ``durable_assets.kit.db.metadata`` is therefore an Alembic
revision under ``versions/``, and every process brings the database to head when it first opens it.

A database made before migrations (our tables, no version table) is upgraded from the base like a
new one: revisions 0001 and 0002 describe what ``create_all`` made and create only what is missing,
so such a database is adopted in place, rows and all.

The version lives in ``durable_alembic_version``: on Postgres our tables share the instance's
database with Dagster's, whose own Alembic history is in ``alembic_version``.
"""

from __future__ import annotations

import functools
import threading
from pathlib import Path

import sqlalchemy as sa
from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy.engine import Connection, Engine

from durable_assets.errors import DurableError

VERSION_TABLE = "durable_alembic_version"
#: Our tables' common prefix: what autogenerate may look at in a database shared with Dagster.
TABLE_PREFIX = "durable_"
#: Key of the Postgres advisory transaction lock that serialises our DDL across processes
#: (the same key the kit used around ``create_all`` before migrations, so old and new code queue).
ADVISORY_LOCK_KEY = 74616273

_HERE = Path(__file__).resolve().parent
# Alembic's ``context`` proxy is module-global: two threads of one process must not run env.py at once.
_env_lock = threading.Lock()


def config(connection: Connection | None = None) -> Config:
    """An Alembic config that needs no alembic.ini, so it works from an installed package."""
    cfg = Config()
    cfg.set_main_option("script_location", str(_HERE))
    if connection is not None:
        cfg.attributes["connection"] = connection
    return cfg


class SchemaTooNewError(DurableError):
    """The database was upgraded by a newer release; this one cannot know what its revisions did."""


@functools.cache
def _script() -> ScriptDirectory:
    """Read once per process: the revisions are files of this package and do not change under it."""
    return ScriptDirectory.from_config(config())


def head_revision() -> str:
    head = _script().get_current_head()
    assert head is not None, "durable_assets/kit/migrations/versions is empty"
    return head


def current_revision(connection: Connection) -> str | None:
    """The revision the database is at; None for a new database or one made before migrations."""
    return MigrationContext.configure(
        connection, opts={"version_table": VERSION_TABLE}
    ).get_current_revision()


def include_name(name: str | None, type_: str, _parent_names: object) -> bool:
    """Only our tables: on Postgres, Dagster's live in the same database and are none of our business."""
    if type_ == "table":
        return bool(name) and str(name).startswith(TABLE_PREFIX) and name != VERSION_TABLE
    return True


def upgrade_to_head(engine: Engine) -> None:
    """Bring the database to head in one transaction that no other process can interleave with.

    Postgres: an advisory transaction lock, so processes opening a new database at once queue and
    the later ones find it at head. SQLite: the engine begins with ``BEGIN IMMEDIATE``, which takes
    the file's write lock before any DDL (waiting up to the busy timeout for another process).
    Both dialects roll DDL back with the transaction, so a crash mid-upgrade leaves the old version.
    """
    with _env_lock, engine.begin() as conn:
        if conn.dialect.name == "postgresql":
            conn.execute(sa.text("SELECT pg_advisory_xact_lock(:key)"), {"key": ADVISORY_LOCK_KEY})
        current = current_revision(conn)
        if current == head_revision():
            return
        if current is not None and current not in {r.revision for r in _script().walk_revisions()}:
            raise SchemaTooNewError(
                f"our tables in {engine.url.render_as_string(hide_password=True)} are at schema revision "
                f"{current}, which this release does not know (its newest is {head_revision()}): a newer "
                "release has upgraded them. Run that release, or restore a backup taken before it ran."
            )
        command.upgrade(config(conn), "head")
