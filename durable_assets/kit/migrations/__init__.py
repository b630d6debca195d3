"""Versioned migrations for the kit's own tables (never Dagster's).

``create_all`` only ever adds missing tables: it cannot alter one, and it leaves no record of which
schema a database has, so a column added to a table in a later release would silently never reach
an existing instance. Each change to ``durable_assets.kit.db.metadata`` is therefore an Alembic
revision under ``versions/``, and every process brings the database to head when it first opens it.

A database made before migrations (our tables, no version table) is upgraded from the base like a
new one: revisions 0001 and 0002 describe what ``create_all`` made and create only what is missing,
so such a database is adopted in place, rows and all.

The version lives in ``durable_alembic_version``: on Postgres our tables share the instance's
database with Dagster's, whose own Alembic history is in ``alembic_version``. A new revision
moves ``head`` below (an upgrade refuses to run while it names an older one).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from durable_assets.kit.schema_migrations import Migrations, SchemaTooNewError

__all__ = ["SchemaTooNewError"]  # re-exported: callers catch it where the kit's upgrade raises it

if TYPE_CHECKING:
    from alembic.config import Config
    from sqlalchemy.engine import Connection, Engine

VERSION_TABLE = "durable_alembic_version"
#: Our tables' common prefix: what autogenerate may look at in a database shared with Dagster.
TABLE_PREFIX = "durable_"
#: Key of the Postgres advisory transaction lock that serialises our DDL across processes
#: (the same key the kit used around ``create_all`` before migrations, so old and new code queue).
ADVISORY_LOCK_KEY = 74616273


def include_name(name: str | None, type_: str, _parent_names: object) -> bool:
    """Only our tables: on Postgres, Dagster's live in the same database and are none of our business."""
    if type_ == "table":
        return bool(name) and str(name).startswith(TABLE_PREFIX) and name != VERSION_TABLE
    return True


MIGRATIONS = Migrations(
    Path(__file__).resolve().parent,
    version_table=VERSION_TABLE,
    head="0011",
    include_name=include_name,
    lock_key=ADVISORY_LOCK_KEY,
)


def config(connection: Connection | None = None) -> Config:
    return MIGRATIONS.config(connection)


def head_revision() -> str:
    return MIGRATIONS.head


def current_revision(connection: Connection) -> str | None:
    """The revision the database is at; None for a new database or one made before migrations."""
    return MIGRATIONS.current(connection)


def upgrade_to_head(engine: Engine) -> None:
    """Bring our tables to head (see :meth:`Migrations.upgrade`); Alembic loads only if they are not."""
    MIGRATIONS.upgrade(engine)
