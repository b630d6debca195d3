"""Alembic's entry point, for both the kit at runtime and authors running the ``alembic`` CLI.

At runtime :func:`durable_assets.kit.migrations.upgrade_to_head` hands over a connection already
inside its locked transaction. From the CLI (``alembic -c durable_assets/kit/migrations/alembic.ini
-x url=sqlite:////tmp/scratch.db upgrade head``) the database comes from ``-x url=``.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import context

from durable_assets.kit.db import metadata
from durable_assets.kit.migrations import VERSION_TABLE, include_name


def _run(connection: sa.Connection) -> None:
    context.configure(
        connection=connection,
        target_metadata=metadata,
        version_table=VERSION_TABLE,
        include_name=include_name,
        # SQLite alters a table by copying it; batch mode writes revisions that work on both backends.
        render_as_batch=True,
        compare_type=True,
    )
    with context.begin_transaction():
        context.run_migrations()


connection = context.config.attributes.get("connection")
if connection is not None:
    _run(connection)
else:
    url = context.get_x_argument(as_dictionary=True).get("url")
    if not url:
        raise SystemExit("pass the database with -x url=sqlite:///path/durable.db (or a postgresql:// URL)")
    with sa.create_engine(url).connect() as conn:
        _run(conn)
        conn.commit()
