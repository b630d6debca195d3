"""Our tables' migrations: old databases are adopted in place, new ones end at head, and head is
exactly ``metadata``.

The old databases are not rebuilt from what we think older releases wrote: ``tests/kit/data`` holds
SQL captured from databases the releases themselves made and filled (scripts/make_legacy_durable_db.py):
c331e5e is the last release without migrations (every table, durable_effect_subjects included);
fd55ef4 predates the webhook outbox and still has the retired ``durable_idempotency.attempts``.
"""

from __future__ import annotations

import json
import multiprocessing as mp
import os
import sqlite3
import subprocess
from pathlib import Path
from typing import Any

import psycopg2
import pytest
import sqlalchemy as sa
from alembic.autogenerate import compare_metadata
from alembic.operations import Operations
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from dagster import DagsterEventType, DagsterInstance

from durable_assets.kit import migrations
from durable_assets.kit.account_bindings import AccountBindings
from durable_assets.kit.accounts import UNBOUND_NAMESPACE, ProviderAccount
from durable_assets.kit.db import DurableDatabase, metadata
from durable_assets.kit.leases import LeaseStore
from durable_assets.kit.ledger import Intent, Ledger
from durable_assets.kit.progress import Progress, ProgressStore
from durable_assets.payments.store import PaymentStore
from tests.support.machine import scaled

DATA = Path(__file__).parent / "data"
REPO = Path(__file__).resolve().parents[2]
PYTHON = REPO / ".venv" / "bin" / "python"
#: The last release that made our tables with ``create_all`` (the captures in ``data`` are its too).
LAST_RELEASE = "c331e5e"
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


def _accounts_of_keyed_rows(url: str) -> set[str]:
    engine = sa.create_engine(url)
    try:
        with engine.connect() as conn:
            return {
                str(account)
                for table in ("durable_idempotency", "durable_effect_subjects")
                for (account,) in conn.execute(sa.text(f"SELECT account FROM {table}"))
            }
    finally:
        engine.dispose()


def _adopted_by_first_binding(db: DurableDatabase) -> Ledger:
    """Keys made before accounts were recorded belong to the first account a batch binds (0004)."""
    account = ProviderAccount("embedded", "acct_upgraded")
    AccountBindings(db).bind("first-batch-after-upgrade", account)
    assert Ledger(db, account=UNBOUND_NAMESPACE).entries("refund") == []
    return Ledger(db, account=account.namespace)


def test_the_last_release_without_migrations_is_upgraded_in_place(durable_db_url: str) -> None:
    _load(durable_db_url, "durable_c331e5e")
    before = _our_rows(durable_db_url)
    assert len(before) == 6 and all(before.values())  # every table, each with a row

    db = DurableDatabase(durable_db_url)

    assert _version_rows(db) == [migrations.head_revision()]
    after = _our_rows(durable_db_url, drop=("account",))
    assert {table: rows for table, rows in after.items() if table in before} == before
    assert all(not rows for table, rows in after.items() if table not in before)  # later revisions' tables
    assert _schema_drift(db) == []
    assert _accounts_of_keyed_rows(durable_db_url) == {UNBOUND_NAMESPACE}
    ledger = _adopted_by_first_binding(db)
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

    after = _our_rows(url, drop=("account",))
    assert {name: after[name] for name in before} == before
    assert after["durable_webhook_outbox"] == after["durable_effect_subjects"] == set()
    assert _schema_drift(db) == []
    ledger = _adopted_by_first_binding(db)
    assert ledger.claim("refund", [DONE], owner="run-after-upgrade").finished == {DONE.key: DONE_RESULT}
    # A new key can be claimed again: the NOT NULL ``attempts`` no insert names any more is gone.
    assert [e.key for e in ledger.claim("refund", [Intent("new", {"a": 1})], owner="r").owned] == ["new"]


def test_a_new_database_ends_at_head_with_every_table_of_metadata(durable_db_url: str) -> None:
    db = DurableDatabase(durable_db_url)
    assert _version_rows(db) == [migrations.head_revision()]
    with db.engine.connect() as conn:
        assert set(metadata.tables) <= set(sa.inspect(conn).get_table_names())
    assert _schema_drift(db) == []


def test_a_database_a_newer_release_upgraded_is_refused_by_name(tmp_path: Path) -> None:
    """Running older code on it would write rows into tables it does not know the shape of."""
    url = f"sqlite:///{tmp_path / 'durable.db'}"
    with sqlite3.connect(tmp_path / "durable.db") as conn:
        conn.execute(f"CREATE TABLE {migrations.VERSION_TABLE} (version_num VARCHAR(32) PRIMARY KEY)")
        conn.execute(f"INSERT INTO {migrations.VERSION_TABLE} VALUES ('9999')")
    with pytest.raises(migrations.SchemaTooNewError, match="revision 9999, which this release does not know"):
        DurableDatabase(url)


def test_the_revisions_form_one_line() -> None:
    """One head: two revisions on the same parent would leave a database at either, not both."""
    script = ScriptDirectory.from_config(migrations.config())
    assert script.get_heads() == [migrations.head_revision()]
    assert [r.revision for r in script.walk_revisions()][-2:] == ["0002", "0001"]


def _open(url: str, start: Any, out: Any) -> None:
    start.wait(timeout=scaled(60))
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
    results = [out.get(timeout=scaled(120)) for _ in procs]
    for p in procs:
        p.join(timeout=scaled(60))
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

    # 0001 fails after dropping ``attempts`` and creating the outbox: both must be undone.
    monkeypatch.setattr(Operations, "create_index", broken)
    with pytest.raises(RuntimeError, match="disk full"):
        DurableDatabase(url)
    assert _our_rows(url) == before

    monkeypatch.undo()  # the next open of the same URL in this process tries again, and succeeds
    assert _version_rows(DurableDatabase(url)) == [migrations.head_revision()]


@pytest.fixture(scope="module")
def last_release(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The last release's code, from this repository's history (absent from a shallow clone)."""
    archive = subprocess.run(["git", "-C", str(REPO), "archive", LAST_RELEASE], capture_output=True)
    if archive.returncode != 0:
        pytest.skip(f"commit {LAST_RELEASE} is not in this clone: {archive.stderr.decode().strip()}")
    dest = tmp_path_factory.mktemp(LAST_RELEASE)
    subprocess.run(["tar", "-x", "-C", str(dest)], input=archive.stdout, check=True)
    return dest


def _cli(code: Path, home: Path, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    """``job ARGS`` from the code in ``code`` (the cwd too: ``python -m`` puts it first on the path)."""
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("DURABLE_", "DAGSTER_", "STRIPE_"))}
    return subprocess.run(
        [str(PYTHON), "-m", "durable_assets.ops.cli", *args],
        cwd=code,
        env={
            **clean,
            "DAGSTER_HOME": str(home),
            "PYTHONPATH": str(code),
            "PYTHONDONTWRITEBYTECODE": "1",
            **env,
        },
        capture_output=True,
        text=True,
        timeout=scaled(240),
        check=False,
    )


@pytest.mark.slow
def test_a_batch_the_last_release_failed_resumes_after_the_upgrade(
    dagster_home: Path, last_release: Path
) -> None:
    """The whole instance, not only our tables: Dagster's runs and our rows, both from the old code."""
    failed = _cli(
        last_release, dagster_home, "run", "--id", "legacy", "--size", "50", DURABLE_MAX_REFUNDS_PER_BATCH="1"
    )
    assert failed.returncode == 1 and "failed at step 4" in failed.stderr, failed.stderr
    url = f"sqlite:///{dagster_home / 'durable.db'}"
    with sqlite3.connect(dagster_home / "durable.db") as conn:
        tables = {name for (name,) in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
    assert "durable_progress" in tables and migrations.VERSION_TABLE not in tables  # made by create_all

    resumed = _cli(REPO, dagster_home, "resume", "--id", "legacy")

    assert resumed.returncode == 0, resumed.stderr
    status = json.loads(_cli(REPO, dagster_home, "status", "--id", "legacy", "--json").stdout)
    assert status["status"] == "succeeded"
    assert [s["executions"] for s in status["steps"][:3]] == [1, 1, 1]  # resumed, not started over
    assert len(status["run_ids"]) == 2
    db = DurableDatabase(url)
    assert _version_rows(db) == [migrations.head_revision()]
    with PaymentStore(str(dagster_home / "payments.db")) as store:
        sent = store.stats()["refunds_created"]
    bound = AccountBindings(db).get("legacy")
    assert bound is not None and bound.kind == "embedded"
    finished = [e for e in Ledger(db, account=bound.namespace).entries("refund") if e.result is not None]
    assert sent == len(finished) > 0  # each refund sent once, and the ledger knows every one
    # The release moved the duplicate check to reconciled_refunds under a new step key: the resume
    # dropped the old key and ran the new check, which never ran for this batch.
    with DagsterInstance.get() as instance:  # the fixture points DAGSTER_HOME at dagster_home
        resume_run = instance.get_run_by_id(status["run_ids"][-1])
        assert resume_run is not None
        evaluations = [
            e.dagster_event.event_specific_data
            for e in instance.all_logs(resume_run.run_id, of_type=DagsterEventType.ASSET_CHECK_EVALUATION)
            if e.dagster_event is not None
        ]
    checks = {e.check_name: e.passed for e in evaluations}  # type: ignore[union-attr]
    assert checks.get("no_duplicate_refunds_at_provider") is True, checks
