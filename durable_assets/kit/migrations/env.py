"""Alembic's entry point for every schema history (see kit/schema_migrations.py), at runtime and for
authors running the ``alembic`` CLI on the kit's own tables.

At runtime :meth:`Migrations.upgrade` hands over itself and a connection already inside its locked
transaction. From the CLI (``alembic -c durable_assets/kit/migrations/alembic.ini -x
url=sqlite:////tmp/scratch.db upgrade head``) the history is the kit's and the database comes from
``-x url=``.
"""

from __future__ import annotations

import dataclasses

import sqlalchemy as sa
from alembic import context

from durable_assets.kit.schema_migrations import Migrations


def _run(connection: sa.Connection, migrations: Migrations) -> None:
    context.configure(
        connection=connection,
        target_metadata=migrations.target_metadata,
        version_table=migrations.version_table,
        include_name=migrations.include_name,
        # SQLite alters a table by copying it; batch mode writes revisions that work on both backends.
        render_as_batch=True,
        compare_type=True,
    )
    with context.begin_transaction():
        context.run_migrations()


def _kits_own() -> Migrations:
    from durable_assets.kit.db import metadata
    from durable_assets.kit.migrations import MIGRATIONS

    return dataclasses.replace(MIGRATIONS, target_metadata=metadata)


connection = context.config.attributes.get("connection")
if connection is not None:
    _run(connection, context.config.attributes["migrations"])
else:
    url = context.get_x_argument(as_dictionary=True).get("url")
    if not url:
        raise SystemExit("pass the database with -x url=sqlite:///path/durable.db (or a postgresql:// URL)")
    with sa.create_engine(url).connect() as conn:
        _run(conn, context.config.attributes.get("migrations") or _kits_own())
        conn.commit()
