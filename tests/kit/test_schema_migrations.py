"""A job author's own schema history beside the kit's, in the same database: each is upgraded by its
own revisions and recorded in its own version table, and neither sees the other's."""

from __future__ import annotations

from pathlib import Path

import pytest
import sqlalchemy as sa

from durable_assets.kit import Migrations
from durable_assets.kit import migrations as kit_migrations
from durable_assets.kit.db import DurableDatabase

_REVISION = """
from alembic import op
import sqlalchemy as sa

revision = "{rev}"
down_revision = {down!r}


def upgrade() -> None:
    {body}
"""


def _history(folder: Path, *bodies: str) -> Migrations:
    """Revisions 0001..N of a history of one's own, each running one ``op`` call."""
    (folder / "versions").mkdir(parents=True)
    for number, body in enumerate(bodies, start=1):
        down = f"{number - 1:04d}" if number > 1 else None
        text = _REVISION.format(rev=f"{number:04d}", down=down, body=body)
        (folder / "versions" / f"r{number:04d}_step.py").write_text(text)
    return Migrations(folder, version_table="shop_alembic_version", head=f"{len(bodies):04d}")


def _versions(url: str) -> dict[str, list[str]]:
    engine = sa.create_engine(url)
    try:
        with engine.connect() as conn:
            return {
                table: list(conn.execute(sa.text(f"SELECT version_num FROM {table}")).scalars())
                for table in ("shop_alembic_version", kit_migrations.VERSION_TABLE)
            }
    finally:
        engine.dispose()


def test_a_history_of_ones_own_lives_beside_the_kits(durable_db_url: str, tmp_path: Path) -> None:
    DurableDatabase(durable_db_url)  # the kit's tables, at the kit's head
    cards = 'op.create_table("shop_cards", sa.Column("key", sa.String(64), primary_key=True))'
    first = _history(tmp_path / "v1", cards)

    first.upgrade(durable_db_url)
    engine = sa.create_engine(durable_db_url)
    with engine.begin() as conn:
        conn.execute(sa.text("INSERT INTO shop_cards (key) VALUES ('card-1')"))
    engine.dispose()
    later = _history(tmp_path / "v2", cards, 'op.add_column("shop_cards", sa.Column("sent_at", sa.Float))')
    later.upgrade(durable_db_url)
    later.upgrade(durable_db_url)  # at head: nothing to do

    assert _versions(durable_db_url) == {
        "shop_alembic_version": ["0002"],
        kit_migrations.VERSION_TABLE: [kit_migrations.head_revision()],
    }
    engine = sa.create_engine(durable_db_url)
    with engine.connect() as conn:
        assert list(conn.execute(sa.text("SELECT key, sent_at FROM shop_cards"))) == [("card-1", None)]
    engine.dispose()


def test_a_head_that_is_not_the_newest_revision_stops_the_upgrade(tmp_path: Path) -> None:
    """A revision added without moving ``head`` would never reach a database already at the old head."""
    history = _history(tmp_path / "h", "pass", "pass")
    stale = Migrations(history.script_location, version_table=history.version_table, head="0001")

    with pytest.raises(RuntimeError, match="the newest revision is 0002 but head='0001'"):
        stale.upgrade(tmp_path / "shop.db")
