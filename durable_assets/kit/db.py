"""The durability kit's tables, stored beside Dagster's own.

Our rows (idempotency ledger, leases, cancel requests, progress, outboxes) must commit in the same
place as Dagster's run storage, so that moving the instance to Postgres moves them too and there is
never a second database to run or back up. SQLite instances get one file, ``durable.db``, inside
``DAGSTER_HOME``; ``dagster-postgres`` instances get ``durable_*`` tables in their own database.
A change to a table here needs a revision in ``migrations/versions`` (see that package).
"""

from __future__ import annotations

import dataclasses
import functools
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import sqlalchemy as sa
from sqlalchemy.engine import Connection, Engine

from durable_assets.kit.migrations import upgrade_to_head
from durable_assets.kit.sqlite_wal import enable_wal

if TYPE_CHECKING:
    from _typeshed import DataclassInstance
    from dagster import DagsterInstance

RowT = TypeVar("RowT", bound="DataclassInstance")

metadata = sa.MetaData()

#: Width of a provider account's ledger namespace (``kind:account:mode``, see kit/accounts.py).
ACCOUNT_WIDTH = 160

idempotency = sa.Table(
    "durable_idempotency",
    metadata,
    # The provider account the key was sent to: keys are scoped per account, as at Stripe, so a
    # batch against a second account never takes the first account's settled results as its own.
    sa.Column("account", sa.String(ACCOUNT_WIDTH), primary_key=True),
    sa.Column("scope", sa.String(64), primary_key=True),
    sa.Column("key", sa.String(255), primary_key=True),
    sa.Column("fingerprint", sa.String(64), nullable=False),
    # started -> finished | review. One-way: a finished or review row is never reopened.
    sa.Column("recovery_point", sa.String(16), nullable=False),
    sa.Column("params", sa.Text, nullable=False),
    sa.Column("result", sa.Text),
    sa.Column("owner_run", sa.String(64)),
    sa.Column("claimed_by", sa.String(64)),
    sa.Column("claim_fence", sa.BigInteger, nullable=False, default=0),
    sa.Column("claim_expires_at", sa.Float, nullable=False, default=0.0),
    sa.Column("created_at", sa.Float, nullable=False),
    sa.Column("updated_at", sa.Float, nullable=False),
)

effect_subjects = sa.Table(
    "durable_effect_subjects",
    metadata,
    # At most one idempotency key per business subject (e.g. "a refund of charge X for reason R"),
    # whatever rows, batches or workers name it: keys come from one identity (the invoice), the
    # subject from another (the charge), and the money follows the subject. Per provider account.
    sa.Column("account", sa.String(ACCOUNT_WIDTH), primary_key=True),
    sa.Column("scope", sa.String(64), primary_key=True),
    sa.Column("subject", sa.String(255), primary_key=True),
    sa.Column("key", sa.String(255), nullable=False),
    sa.Column("created_at", sa.Float, nullable=False),
)

leases = sa.Table(
    "durable_leases",
    metadata,
    sa.Column("batch_id", sa.String(64), primary_key=True),
    sa.Column("run_id", sa.String(64), nullable=False),
    sa.Column("owner", sa.String(255), nullable=False),
    # Fencing token: grows by one on every takeover, so an orphan can tell it was superseded.
    sa.Column("fence", sa.BigInteger, nullable=False),
    sa.Column("heartbeat_at", sa.Float, nullable=False),
    sa.Column("expires_at", sa.Float, nullable=False),
    sa.Column("released", sa.Boolean, nullable=False, default=False),
)

cancel_requests = sa.Table(
    "durable_cancel_requests",
    metadata,
    sa.Column("batch_id", sa.String(64), primary_key=True),
    sa.Column("requested_at", sa.Float, nullable=False),
)

#: A signal (Ctrl-C, SIGTERM) the process running a batch received, for the tasks of that run on
#: other processes: the process-wide stop flag (kit/interrupts.py) reaches only its own threads.
#: Scoped to the run, so the resume's run does not see it; unlike a cancel, the batch is interrupted.
stop_requests = sa.Table(
    "durable_stop_requests",
    metadata,
    sa.Column("batch_id", sa.String(64), primary_key=True),
    sa.Column("run_id", sa.String(64), primary_key=True),
    sa.Column("signal", sa.Integer, nullable=False),
    sa.Column("requested_at", sa.Float, nullable=False),
)

#: Where each page of a provider's list began at its last full reading (kit/pacing.py ListCursors):
#: a process that knows them asks for every page at once. A hint for speed, never for what is listed.
list_cursors = sa.Table(
    "durable_list_cursors",
    metadata,
    sa.Column("name", sa.String(255), primary_key=True),  # the list, and a digest of its account
    sa.Column("cursors", sa.Text, nullable=False),  # JSON: the id ending each page but the last
    sa.Column("updated_at", sa.Float, nullable=False),
)

progress = sa.Table(
    "durable_progress",
    metadata,
    sa.Column("batch_id", sa.String(64), primary_key=True),
    sa.Column("run_id", sa.String(64), nullable=False),
    sa.Column("step", sa.Integer, nullable=False),
    sa.Column("total", sa.Integer, nullable=False),
    sa.Column("label", sa.String(255), nullable=False),
    sa.Column("done", sa.BigInteger, nullable=False),
    sa.Column("of", sa.BigInteger, nullable=False),
    sa.Column("updated_at", sa.Float, nullable=False),
)

shard_progress = sa.Table(
    "durable_shard_progress",
    metadata,
    # One row per shard of a sharded step (kit/sharding.py): the batch's ``durable_progress`` row
    # shows their sum while the step runs, so shards reporting at once add up instead of overwriting.
    sa.Column("batch_id", sa.String(64), primary_key=True),
    sa.Column("step", sa.String(255), primary_key=True),  # the step's key, not the shard's
    sa.Column("shards", sa.Integer, primary_key=True),
    sa.Column("shard", sa.Integer, primary_key=True),
    sa.Column("run_id", sa.String(64), nullable=False),  # the run that wrote it last
    sa.Column("done", sa.BigInteger, nullable=False),
    sa.Column("of", sa.BigInteger, nullable=False),
    # False: ``of`` is the shard's row count, from before the shard counted its own work.
    sa.Column("counted", sa.Boolean, nullable=False),
    sa.Column("updated_at", sa.Float, nullable=False),
)

webhook_outbox = sa.Table(
    "durable_webhook_outbox",
    metadata,
    # One row per (message, endpoint): the message id is the Standard Webhooks ``webhook-id``, the
    # same on every retry, so a receiver deduplicates a re-send after a crash between send and record.
    sa.Column("webhook_id", sa.String(64), primary_key=True),
    sa.Column("url", sa.String(2000), primary_key=True),
    sa.Column("batch_id", sa.String(64), nullable=False, index=True),
    sa.Column("run_id", sa.String(64)),
    sa.Column("event_type", sa.String(64), nullable=False),
    sa.Column("body", sa.Text, nullable=False),  # frozen at enqueue: every attempt sends the same bytes
    # pending -> delivered | failed (gave up). One-way.
    sa.Column("state", sa.String(16), nullable=False),
    sa.Column("attempts", sa.Integer, nullable=False, default=0),
    sa.Column("next_attempt_at", sa.Float, nullable=False),
    sa.Column("claimed_by", sa.String(64)),
    sa.Column("claim_expires_at", sa.Float, nullable=False, default=0.0),
    sa.Column("last_status", sa.Integer),
    sa.Column("last_error", sa.Text),
    sa.Column("created_at", sa.Float, nullable=False),
    sa.Column("updated_at", sa.Float, nullable=False),
    sa.Column("delivered_at", sa.Float),
)

step_leases = sa.Table(
    "durable_step_leases",
    metadata,
    # One row per step of a distributed run: which task execution runs it now, until when. The
    # orchestrator re-sends a step whose lease lapsed; a task whose row names another execution stops.
    sa.Column("run_id", sa.String(64), primary_key=True),
    sa.Column("step_key", sa.String(255), primary_key=True),
    sa.Column("batch_id", sa.String(64), nullable=False, index=True),
    # The orchestrator's send number of this step in this run: a newer send supersedes an older one.
    sa.Column("attempt", sa.Integer, nullable=False),
    sa.Column("owner", sa.String(255), nullable=False),  # host:pid:task execution
    sa.Column("heartbeat_at", sa.Float, nullable=False),
    sa.Column("expires_at", sa.Float, nullable=False),
    sa.Column("finished", sa.Boolean, nullable=False, default=False),
)

batch_accounts = sa.Table(
    "durable_batch_accounts",
    metadata,
    # The provider account a batch is bound to, from its first run on: every resume, re-execution,
    # shard and retry must talk to the same account (kit/account_bindings.py).
    sa.Column("batch_id", sa.String(64), primary_key=True),
    sa.Column("kind", sa.String(32), nullable=False),
    sa.Column("account", sa.String(128), nullable=False),
    sa.Column("livemode", sa.Boolean, nullable=False),
    sa.Column("bound_at", sa.Float, nullable=False),
)

batch_guardrails = sa.Table(
    "durable_batch_guardrails",
    metadata,
    # The ceilings and limits of one guardrail resource (kit/guardrails.py) as the batch first ran
    # with them: every later run of the batch uses these, whatever its own environment says.
    sa.Column("batch_id", sa.String(64), primary_key=True),
    sa.Column("name", sa.String(128), primary_key=True),  # the resource's guardrail name
    sa.Column("guardrail_values", sa.Text, nullable=False),  # JSON: field -> value
    sa.Column("pinned_at", sa.Float, nullable=False),
    # Set by `job resume --override-guardrails`: when, and the values it replaced (JSON).
    sa.Column("overridden_at", sa.Float),
    sa.Column("overridden_from", sa.Text),
)

batch_code = sa.Table(
    "durable_batch_code",
    metadata,
    # The code version of each step as the batch first ran (kit/code_versions.py): a resume on code
    # that changed in a step with recorded effects is refused until the old code is back or a person
    # accepts the change (`job resume --accept-code-change`).
    sa.Column("batch_id", sa.String(64), primary_key=True),
    sa.Column("step", sa.String(255), primary_key=True),
    sa.Column("version", sa.String(255), nullable=False),
    sa.Column("declared", sa.Boolean, nullable=False),  # the author's code_version, not a fingerprint
    sa.Column("pinned_at", sa.Float, nullable=False),
    # The deployed version a refused resume (or a run that stopped on it) saw, for `job status`.
    sa.Column("seen_version", sa.String(255)),
    sa.Column("seen_at", sa.Float),
    # Set by `job resume --accept-code-change`: when, and the version it replaced.
    sa.Column("accepted_at", sa.Float),
    sa.Column("accepted_from", sa.String(255)),
)

batch_items = sa.Table(
    "durable_batch_items",
    metadata,
    # Each item's key and subject as the batch's mutating step first derived them (kit/ledger.py,
    # Intent.item): a resume on code that derives another key or subject for an item stops before
    # it sends anything, whatever the code versions say.
    sa.Column("batch_id", sa.String(64), primary_key=True),
    sa.Column("scope", sa.String(64), primary_key=True),
    sa.Column("item", sa.String(255), primary_key=True),
    sa.Column("key", sa.String(255), nullable=False),
    sa.Column("subject", sa.String(255)),
    sa.Column("created_at", sa.Float, nullable=False),
)

item_decisions = sa.Table(
    "durable_item_decisions",
    metadata,
    # What a person decided for one item of a job at one provider account (kit/decisions.py): kept
    # beside the ledger, in the same namespace as its keys, and read by every later batch of the job.
    sa.Column("account", sa.String(160), primary_key=True),
    sa.Column("job", sa.String(255), primary_key=True),
    sa.Column("item", sa.String(255), primary_key=True),
    sa.Column("decision", sa.String(64), nullable=False),
    sa.Column("note", sa.Text, nullable=False),
    sa.Column("decided_at", sa.Float, nullable=False),
    sa.Column("decided_by", sa.String(255), nullable=False),
)

rate_limits = sa.Table(
    "durable_rate_limits",
    metadata,
    # One token bucket per account (provider + key), shared by every worker of every batch.
    sa.Column("name", sa.String(255), primary_key=True),
    sa.Column("tokens", sa.Float, nullable=False),
    sa.Column("updated_at", sa.Float, nullable=False),
)

blobs = sa.Table(
    "durable_blobs",
    metadata,
    # Step outputs, batch files and stored inputs when DURABLE_STORAGE is the database
    # (kit/storage.py): every host of a deployment reaches them through the instance's database.
    sa.Column("key", sa.String(1024), primary_key=True),
    sa.Column("data", sa.LargeBinary, nullable=False),
    sa.Column("size", sa.BigInteger, nullable=False),
    sa.Column("stored_at", sa.Float, nullable=False),
)

#: Dagster's storages of an instance: run, event log, schedule (each its own engine).
DAGSTER_STORAGES = 3


@dataclasses.dataclass(frozen=True)
class ConnectionBounds:
    """How many connections one process may hold to the instance's database, and keeps open.

    Ours: ``pool_size`` kept open once used, ``max_overflow`` more opened at a busy moment and closed
    when given back. Dagster's (on Postgres, after :func:`hold_connections`): one kept open per
    storage, ``dagster_overflow`` more at a moment. Every thread holds at most one connection of an
    engine at a time, except Dagster's event log writing an asset event for the first time in a
    process (it checks the schema on a second connection): so an overflow of at least 1 there.
    """

    pool_size: int
    max_overflow: int
    dagster_overflow: int

    @property
    def most(self) -> int:
        """The most connections the process can hold at once: ours, and Dagster's three storages'."""
        return self.pool_size + self.max_overflow + DAGSTER_STORAGES * (1 + self.dagster_overflow)


#: A process that runs steps itself (`job run`, `job resume` in process, `job serve`). An effect
#: runner's threads (``DURABLE_CONCURRENCY``, 16 by default) each hold one of ours at a time, beside
#: the lease heartbeat and the progress writer: a smaller pool closed the overflow connection after
#: every use and opened a new one for the next (1,155 connects for one 1,000-invoice batch, each with
#: its PRAGMAs or a Postgres handshake). Dagster's overflow is its webserver's (many request threads).
THREADED = ConnectionBounds(pool_size=20, max_overflow=16, dagster_overflow=20)


def one_task_at_a_time(pool_size: int) -> ConnectionBounds:
    """A `job worker`'s pool child (it runs one step at a time) or a distributed run's orchestrator
    (it runs none): ``pool_size`` of ours kept open, as many again at a moment, and one held per
    Dagster storage with one more at a moment. Idle, a child holds ``pool_size`` + 2 (a task does
    not use the schedule storage); 20 a child, with :data:`THREADED`, ran 2 workers x 2 children out
    of a stock ``max_connections=100``. Its step's effect threads then take turns on our few
    connections: each holds one for a single short statement (the cancel and fence check before a
    request) or a group commit's one transaction, never across a provider request."""
    return ConnectionBounds(pool_size=pool_size, max_overflow=pool_size, dagster_overflow=1)


_bounds = THREADED
_engines: dict[str, Engine] = {}
#: Rows per round trip when an executemany goes to Postgres (a ledger chunk is at most 200 keys).
EXECUTEMANY_PAGE_ROWS = 500
_engines_lock = threading.Lock()


def bound_connections(bounds: ConnectionBounds) -> None:
    """This process's connections from now on: engines opened before are closed and forgotten (the
    next use opens one within ``bounds``); call it before opening anything that keeps them."""
    global _bounds
    with _engines_lock:
        _bounds = bounds
        for engine in _engines.values():
            engine.dispose()
        _engines.clear()


#: Execution option that marks a connection as read-only (see :meth:`DurableDatabase.read`).
_READ_ONLY = "durable_read_only"


def _configure_sqlite(engine: Engine) -> None:
    """WAL + IMMEDIATE transactions: readers never block, and two writers queue instead of deadlocking."""

    @sa.event.listens_for(engine, "connect")
    def _on_connect(dbapi_conn: Any, _record: Any) -> None:
        dbapi_conn.isolation_level = None  # let BEGIN below own the transaction
        enable_wal(dbapi_conn)
        cur = dbapi_conn.cursor()
        cur.execute("PRAGMA synchronous=NORMAL")
        cur.execute("PRAGMA busy_timeout=60000")
        cur.close()

    @sa.event.listens_for(engine, "begin")
    def _on_begin(conn: Connection) -> None:
        # A read takes no write lock: in WAL mode it then never waits, even on a writer frozen
        # mid-transaction (SIGSTOP), which status, leases and the HTTP API must see past.
        if conn.get_execution_options().get(_READ_ONLY):
            conn.exec_driver_sql("BEGIN DEFERRED")
        else:
            conn.exec_driver_sql("BEGIN IMMEDIATE")


def engine_for_url(url: str) -> Engine:
    """One engine per URL per process; the first use in a process brings our tables to the newest revision."""
    with _engines_lock:
        engine = _engines.get(url)
        if engine is None:
            if url.startswith("sqlite"):
                engine = sa.create_engine(
                    url,
                    connect_args={"timeout": 60, "check_same_thread": False},
                    pool_size=_bounds.pool_size,
                    max_overflow=_bounds.max_overflow,
                )
                _configure_sqlite(engine)
            else:
                # dagster-postgres ships psycopg2; SQLAlchemy 2.1 would otherwise pick psycopg 3.
                driver_url = url.replace("postgresql://", "postgresql+psycopg2://", 1)
                engine = sa.create_engine(
                    driver_url,
                    pool_pre_ping=True,
                    pool_size=_bounds.pool_size,
                    max_overflow=_bounds.max_overflow,
                    # psycopg2's own executemany sends one statement per round trip: a ledger chunk's
                    # 200 intents were 200 round trips before its first request. In batches, it is one
                    # (psycopg2's execute_batch; the statements and the transaction are the same).
                    executemany_mode="values_plus_batch",
                    executemany_batch_page_size=EXECUTEMANY_PAGE_ROWS,
                )
            try:
                upgrade_to_head(engine)
            except BaseException:
                engine.dispose()  # not cached, so the next open retries the upgrade on a new engine
                raise
            _engines[url] = engine
        return engine


def dispose_engines() -> None:
    """Close every pooled connection of this process's engines (they reopen on next use), for a
    caller that changes how new connections are opened (``ops/disk.py``)."""
    with _engines_lock:
        for engine in _engines.values():
            engine.dispose()


def hold_connections(instance: DagsterInstance) -> None:
    """Keep one open connection per Dagster storage instead of one new connection per statement.

    dagster-postgres opens its engines with ``NullPool`` (a process that lives for one short command
    should hold nothing), so every event a step writes, every run read and every dynamic-partition
    check paid a new Postgres connection: 35% of a task's time in a worker profile. A worker and an
    orchestrator live for many statements; Dagster's webserver switches to a held connection for the
    same reason, with the same call (no statement timeout here: a step's queries are short and a
    timeout would fail a batch, not a page). SQLite storages ignore it. One connection is kept per
    storage, and at most ``dagster_overflow`` more opened at once (:func:`bound_connections`).

    On SQLite, where a connection is a file opened per statement and holding it buys little, what
    is kept is each file's engine: Dagster built one per statement, and compiled every statement
    anew in it (``keep_sqlite_engines``).

    Such a process also keeps what Dagster's storages learn of the schema (a migration that has run
    stays run): without it, each dynamic-partition check and asset or run read asked the catalog
    again, 13% of a worker task's time (``remember_schema_checks``).
    """
    from durable_assets.kit.dagster_internals import keep_sqlite_engines, remember_schema_checks

    instance.optimize_for_webserver(
        statement_timeout=0, pool_recycle=3600, max_overflow=_bounds.dagster_overflow
    )
    keep_sqlite_engines(instance)
    remember_schema_checks(instance)


#: Batches whose dynamic partition a process remembers exists (a few bytes each).
KNOWN_PARTITIONS = 1024


def remember_existing_partitions(instance: DagsterInstance) -> None:
    """Ask this instance once per batch whether its dynamic partition exists, not ~80 times a run.

    Dagster asks (``has_dynamic_partition``: a query each) for every input, output and data-version
    lookup of every step: 80 times in a demo batch, 11% of a worker task's time in a profile
    (docs/benchmarks.md, scenario 10). A batch's partition is added before its first run and deleted
    only by retention, once the batch has ended, so "it exists" is remembered for the process (the
    most recent :data:`KNOWN_PARTITIONS`); "it does not" is asked again. For a process that runs
    batches (a worker, `job run`, `job resume`, `job backfill`), not one that serves reads for days.
    """
    from durable_assets.kit.dagster_internals import remember_true

    instance.has_dynamic_partition = remember_true(  # type: ignore[method-assign]
        instance.has_dynamic_partition, max_entries=KNOWN_PARTITIONS
    )


def database_url_for_instance(instance: DagsterInstance) -> str:
    """Where our tables live for this instance: its Postgres database, else a file in DAGSTER_HOME."""
    postgres_url = getattr(instance.run_storage, "postgres_url", None)
    if postgres_url:
        return str(postgres_url)
    return f"sqlite:///{Path(instance.root_directory) / 'durable.db'}"


class DurableDatabase:
    """A handle on our tables; cheap to create, shares the process-wide engine."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.engine = engine_for_url(url)

    @classmethod
    def for_instance(cls, instance: DagsterInstance) -> DurableDatabase:
        return cls(database_url_for_instance(instance))

    @property
    def is_postgres(self) -> bool:
        return self.engine.dialect.name == "postgresql"

    @contextmanager
    def transaction(self) -> Iterator[Connection]:
        """A write transaction; on SQLite it takes the write lock at its start (no upgrade deadlocks)."""
        with self.engine.begin() as conn:
            yield conn

    @contextmanager
    def read(self) -> Iterator[Connection]:
        """A read-only snapshot that never waits on a writer, nor makes one wait."""
        with self.engine.connect() as conn:
            conn.execution_options(**{_READ_ONLY: True})
            yield conn

    def read_row(self, stmt: sa.ClauseElement, row: Mapping[str, Any]) -> tuple[Any, ...] | None:
        """The first row of a prebuilt read, straight through the driver on a pooled connection.

        For a question asked before every side effect (:mod:`durable_assets.kit.standing`): through
        :meth:`read` it cost 76 us of CPU on SQLite, a pooled ``Connection``'s set-up, its ``BEGIN
        DEFERRED`` and rollback; this costs 11 us. One statement is one snapshot on its own, in
        SQLite's autocommit and under Postgres' read committed alike, so it needs no transaction
        of ours, and on SQLite it never waits on a writer, as :meth:`read` does not. On Postgres it
        runs in autocommit, as SQLAlchemy's own ping does: no ``BEGIN``, and no ``ROLLBACK`` round
        trip when the pool takes the connection back."""
        sql, params = statement_params(self.engine.dialect, stmt, row)
        conn = self.engine.raw_connection()
        try:
            driver = conn.dbapi_connection
            autocommit = self.is_postgres and not driver.autocommit  # type: ignore[union-attr]
            if autocommit:
                driver.autocommit = True  # type: ignore[union-attr]
            try:
                cursor = conn.cursor()
                try:
                    cursor.execute(sql, params)
                    found = cursor.fetchone()
                finally:
                    cursor.close()
            finally:
                if autocommit and not driver.closed:  # type: ignore[union-attr]
                    driver.autocommit = False  # type: ignore[union-attr]
        finally:
            conn.close()  # back to the pool
        return None if found is None else tuple(found)

    def clock(self, conn: Connection) -> float:
        """Seconds since the epoch on the one clock that leases, fences and the shared rate bucket use.

        Processes on several hosts do not share a clock, so a lease written from one and judged from
        another must both read the database server's: on Postgres ``clock_timestamp()``, the time
        when this statement runs. Not ``now()``: that is the transaction's start, and a caller reads
        the clock after taking a row lock, so time spent waiting for the lock must count as passed
        (a lease that lapsed during the wait has lapsed). On SQLite every process is on one host and
        reads the same clock the database would (``julianday('now')`` is this clock in milliseconds).
        """
        if self.is_postgres:
            return float(conn.execute(sa.select(self.clock_column())).scalar_one())
        return now()

    def clock_column(self) -> sa.ColumnElement[float]:
        """:meth:`clock` as a column, so that a read gets its rows and the time to judge them by in
        one statement."""
        if self.is_postgres:
            return sa.cast(sa.extract("epoch", sa.func.clock_timestamp()), sa.Float).label("db_now")
        return sa.literal(now(), sa.Float).label("db_now")

    def insert_ignore(self, table: sa.Table) -> Any:
        """An INSERT that skips rows whose primary key exists, in this database's dialect; the same
        statement object every time, so :func:`compiled_for` compiles it once per process."""
        return _insert_ignore(self.is_postgres, table)

    def upsert(self, table: sa.Table, index: list[str], values: dict[str, Any]) -> Any:
        """INSERT ... ON CONFLICT DO UPDATE, portable across our two dialects."""
        stmt: Any = _dialect_insert(self.is_postgres)(table).values(**values)
        update = {k: v for k, v in values.items() if k not in index}
        return stmt.on_conflict_do_update(index_elements=index, set_=update)

    def lock_rows_in_order(self, conn: Connection, ordered_locking_read: sa.Select[Any], params: Any) -> None:
        """Take the row locks of ``ordered_locking_read`` (a ``SELECT ... ORDER BY ... FOR UPDATE``)
        before a statement that would take them in arbitrary order, so two writers of overlapping
        rows cannot deadlock. On SQLite a write transaction holds the one database lock already."""
        if self.is_postgres:
            conn.execute(ordered_locking_read, params)


def _dialect_insert(postgres: bool) -> Callable[[sa.Table], Any]:
    if postgres:
        from sqlalchemy.dialects.postgresql import insert as pg_insert

        return pg_insert
    from sqlalchemy.dialects.sqlite import insert as sqlite_insert

    return sqlite_insert


@functools.cache
def _insert_ignore(postgres: bool, table: sa.Table) -> Any:
    return _dialect_insert(postgres)(table).on_conflict_do_nothing()


@functools.cache
def compiled_for(dialect: sa.Dialect, stmt: sa.ClauseElement) -> tuple[str, list[str] | None, dict[str, Any]]:
    """A prebuilt statement's SQL for ``dialect``, compiled once per process: its parameters' order
    (positional drivers; None for a named paramstyle) and the values it binds itself (literals such
    as ``recovery_point == STARTED``).

    For statements run once per side effect: SQLAlchemy's per-execution cache-key walk and result
    set-up cost ~250 us a statement on SQLite, about six times the query itself.
    """
    compiled = stmt.compile(dialect=dialect)
    order = getattr(compiled, "positiontup", None)  # SQLCompiler's; None for a named paramstyle
    return compiled.string, order, dict(compiled.params)


def driver_params(conn: Connection, stmt: sa.ClauseElement, row: Mapping[str, Any]) -> tuple[str, Any]:
    """``stmt``'s SQL and ``row`` as the driver takes them (see :func:`compiled_for`)."""
    return statement_params(conn.dialect, stmt, row)


def statement_params(dialect: sa.Dialect, stmt: sa.ClauseElement, row: Mapping[str, Any]) -> tuple[str, Any]:
    """:func:`driver_params` for a dialect, no connection needed (:meth:`DurableDatabase.read_row`)."""
    sql, names, fixed = compiled_for(dialect, stmt)
    full = {**fixed, **row}
    return sql, tuple(full[n] for n in names) if names is not None else full


def from_row(cls: type[RowT], row: sa.Row[Any], **convert: Callable[[Any], Any]) -> RowT:
    """A row of one of our tables as its dataclass: each field from the column of the same name.

    ``convert`` names the fields whose column value is made into the field's type first (an
    ``int`` or ``float`` whatever the backend's driver returns for the column); other columns of
    the row are not read, and a field the row has no column for keeps its default.
    """
    values = row._mapping
    return cls(
        **{
            f.name: convert[f.name](values[f.name]) if f.name in convert else values[f.name]
            for f in dataclasses.fields(cls)
            if f.name in values
        }
    )


def now() -> float:
    """This process's wall-clock seconds, for what only this process compares (throttles, ages,
    timestamps); what several processes compare reads :meth:`DurableDatabase.clock`."""
    return time.time()
