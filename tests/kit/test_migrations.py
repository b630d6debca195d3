"""Our tables' migrations: old databases are adopted in place, new ones end at head, and head is
exactly ``metadata``.

The old databases are not rebuilt from what we think older releases wrote: ``tests/kit/data`` holds
SQL captured from databases the releases themselves made and filled (scripts/make_legacy_durable_db.py):
c331e5e is the last release without migrations (every table, durable_effect_subjects included);
fd55ef4 predates the webhook outbox and still has the retired ``durable_idempotency.attempts``.
"""

from __future__ import annotations

import multiprocessing as mp
import sqlite3
from pathlib import Path
from typing import Any

import psycopg2
import pytest
import sqlalchemy as sa
from alembic.autogenerate import compare_metadata
from alembic.operations import Operations
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory

from durable_assets.kit import migrations
from durable_assets.kit.db import DurableDatabase, metadata
from durable_assets.kit.leases import LeaseStore
from durable_assets.kit.ledger import Intent, Ledger
from durable_assets.kit.progress import Progress, ProgressStore

DATA = Path(__file__).parent / "data"
DONE = Intent("refund-legacy-done", {"charge": "ch_legacy", "amount": 1250})
DONE_RESULT = {"amount": 1250, "id": "re_legacy_1", "status": "succeeded"}
SUBJECT = "ch_legacy|requested_by_customer"  # claimed by DONE's key in the c331e5e capture


def _load(url: str, dump: str) -> None:
    """Make the database an old release left behind, from its captured SQL."""
    if url.startswith("sqlite"):
        with sqlite3.connect(url.removeprefix("sqlite:///")) as conn:
            conn.executescript((DATA / f"{dump}.sqlite.sql").read_text())
        return
    conn = psycopg2.connect(url)
    conn.autocommit = True
    conn.cursor().execute((DATA / f"{dump}.pg.sql").read_text())
    conn.close()


def _our_rows(url: str, drop: tuple[str, ...] = ()) -> dict[str, set[tuple[Any, ...]]]:
    """Every row of every one of our tables, read without the kit (which would upgrade first)."""
    engine = sa.create_engine(url)
    try:
        with engine.connect() as conn:
            names = [n for n in sa.inspect(conn).get_table_names() if migrations.include_name(n, "table", {})]
            found = {}
            for name in names:
                table = sa.Table(name, sa.MetaData(), autoload_with=conn)
                columns = [c for c in table.c if c.name not in drop]
                found[name] = {tuple(row) for row in conn.execute(sa.select(*columns))}
            return found
    finally:
        engine.dispose()


def _schema_drift(db: DurableDatabase) -> list[Any]:
    """What autogenerate would write into a new revision: empty when head is exactly ``metadata``."""
    with db.engine.connect() as conn:
        ctx = MigrationContext.configure(
            conn, opts={"include_name": migrations.include_name, "compare_type": True}
        )
        return list(compare_metadata(ctx, metadata))


def _version_rows(db: DurableDatabase) -> list[str]:
    with db.engine.connect() as conn:
        return list(conn.execute(sa.text(f"SELECT version_num FROM {migrations.VERSION_TABLE}")).scalars())


def test_the_last_release_without_migrations_is_upgraded_in_place(durable_db_url: str) -> None:
    _load(durable_db_url, "durable_c331e5e")
    before = _our_rows(durable_db_url)
    assert len(before) == 6 and all(before.values())  # every table, each with a row

    db = DurableDatabase(durable_db_url)

    assert _version_rows(db) == [migrations.head_revision()]
    assert _our_rows(durable_db_url) == before
    assert _schema_drift(db) == []
    ledger = Ledger(db)
    assert ledger.claim("refund", [DONE], owner="run-after-upgrade").finished == {DONE.key: DONE_RESULT}
    # The subject claim survived: another key for the same charge and reason is not sent.
    other = Intent("refund-other-key", {"charge": "ch_legacy", "amount": 1250}, subject=SUBJECT)
    taken = ledger.claim("refund", [other], owner="run-after-upgrade").taken
    assert {k: t.holder_key for k, t in taken.items()} == {other.key: DONE.key}
    lease = LeaseStore(db).get("legacy-batch")
    assert lease is not None and (lease.run_id, lease.fence) == ("legacy-run-0001", 1)
    assert ProgressStore(db).latest("legacy-batch") == Progress(4, 7, "Issuing refunds", 1, 2)


def test_a_release_before_the_outbox_gets_the_missing_tables_and_loses_the_retired_column(
    tmp_path: Path,
) -> None:
    url = f"sqlite:///{tmp_path / 'durable.db'}"
    _load(url, "durable_fd55ef4")
    before = _our_rows(url, drop=("attempts",))
    assert "durable_webhook_outbox" not in before

    db = DurableDatabase(url)

    after = _our_rows(url)
    assert {name: after[name] for name in before} == before
    assert after["durable_webhook_outbox"] == after["durable_effect_subjects"] == set()
    assert _schema_drift(db) == []
    ledger = Ledger(db)
    assert ledger.claim("refund", [DONE], owner="run-after-upgrade").finished == {DONE.key: DONE_RESULT}
    # A new key can be claimed again: the NOT NULL ``attempts`` no insert names any more is gone.
    assert [e.key for e in ledger.claim("refund", [Intent("new", {"a": 1})], owner="r").owned] == ["new"]


def test_a_new_database_ends_at_head_with_every_table_of_metadata(durable_db_url: str) -> None:
    db = DurableDatabase(durable_db_url)
    assert _version_rows(db) == [migrations.head_revision()]
    with db.engine.connect() as conn:
        assert set(metadata.tables) <= set(sa.inspect(conn).get_table_names())
    assert _schema_drift(db) == []


def test_the_revisions_form_one_line_and_the_kit_opens_at_head() -> None:
    """One head: two revisions on the same parent would leave a database at either, not both."""
    script = ScriptDirectory.from_config(migrations.config())
    assert script.get_heads() == [migrations.head_revision()]
    assert [r.revision for r in script.walk_revisions()][-2:] == ["0002", "0001"]


def _open(url: str, start: Any, out: Any) -> None:
    start.wait(timeout=60)
    try:
        with DurableDatabase(url).engine.connect() as conn:
            out.put(("ok", migrations.current_revision(conn)))
    except Exception as exc:  # reported to the parent, which shows it
        out.put(("error", repr(exc)))


def test_four_processes_opening_a_new_database_at_once_all_succeed(durable_db_url: str) -> None:
    ctx = mp.get_context("spawn")
    start = ctx.Barrier(4)
    out: Any = ctx.Queue()
    procs = [ctx.Process(target=_open, args=(durable_db_url, start, out)) for _ in range(4)]
    for p in procs:
        p.start()
    results = [out.get(timeout=120) for _ in procs]
    for p in procs:
        p.join(timeout=60)
    assert results == [("ok", migrations.head_revision())] * 4
    assert _version_rows(DurableDatabase(durable_db_url)) == [migrations.head_revision()]


def test_an_upgrade_that_fails_leaves_the_database_as_it_was(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The upgrade is one transaction: a revision that breaks halfway must not leave half a schema."""
    url = f"sqlite:///{tmp_path / 'durable.db'}"
    _load(url, "durable_fd55ef4")
    before = _our_rows(url)

    def broken(*_args: Any, **_kwargs: Any) -> None:
        raise RuntimeError("disk full")

    monkeypatch.setattr(Operations, "create_index", broken)  # 0001 fails after creating the outbox
    with pytest.raises(RuntimeError, match="disk full"):
        DurableDatabase(url)
    assert _our_rows(url) == before
