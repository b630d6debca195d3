"""Retention: archive, then delete, run lineages that ended long ago.

Dagster never prunes runs or event logs, and its own ``delete_run`` is slow (one run at a time,
one SQLite shard opened per run) and, on the default SQLite instance, frees no disk: the per-run
shard file stays behind, emptied. A durable system that fills its disk is not durable, so this
module removes whole *lineages* (every run carrying the same batch tag) in bulk, each one only
after a complete archive of it is on disk.

Crash safety rests on three rules:

1. **Archive first, fsynced.** A lineage's archive is written to a temporary name, fsynced,
   renamed to a name derived from the lineage (batch ID + first run ID), and the directory is
   fsynced, before any of its rows or stored data is deleted.
2. **Runs go last.** A lineage is visible (and so retried by the next prune) until its runs are
   deleted, and those go in one transaction after its stored data, events, partition and our rows.
   A re-run finds the complete archive, does not write it again, and finishes the delete.
   The stored data (step outputs, files, logs: ``delete_stored``) goes *first* of all: while the
   lineage's lease still keeps resumes out, and while its events still name the assets whose
   outputs it stored. Deleted after the runs, a kill in between would orphan it for good (nothing
   would list that batch again); deleted first, a kill leaves a lineage that the next prune finds,
   whose data it deletes again (what is gone is skipped) before its rows.
3. **One pruner, and no worker, per lineage.** A file lock admits one prune per archive
   directory, and the batch's lease (``kit.leases``) is taken before a lineage is archived, so a
   resume cannot add a run between archive and delete.

Rows are deleted from Dagster's own tables only on the Dagster release whose storage layout was
verified (``is_verified_version``); on any other, the same steps in the same
order go through the public API (``delete_events``, ``delete_dynamic_partition``,
``instance.delete_run``), one run at a time: slower, and on SQLite each run's emptied shard file
stays behind, but nothing depends on a table Dagster may have changed.

Nothing here knows about refunds: callers pass the batch tag, the dynamic-partitions name and an
optional ``status_fn`` whose JSON is stored in the archive.
"""

from __future__ import annotations

import contextlib
import fcntl
import gzip
import json
import logging
import os
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TypeVar

import sqlalchemy as sa
from dagster import DagsterEventType, DagsterInstance, EventLogEntry, RunRecord, RunsFilter
from dagster_shared.serdes import deserialize_value, serialize_value

from durable_assets.errors import (
    ArchiveError,
    BatchConflictError,
    PruneInProgressError,
    StorageError,
    UsageError,
)
from durable_assets.kit.runtime import (
    INSTALLED_DAGSTER_VERSION,
    STARTED,
    VERIFIED_DAGSTER_VERSION,
    AssetEventTagsTable,
    BatchStorage,
    ConcurrencySlotsTable,
    CrashPoint,
    DurableDatabase,
    DynamicPartitionsTable,
    Lease,
    LeaseStore,
    PendingStepsTable,
    Purged,
    RunsTable,
    RunTagsTable,
    SqlEventLogStorage,
    SqlEventLogStorageTable,
    SqlRunStorage,
    crash_point,
    effect_subjects,
    idempotency,
    is_verified_version,
    now,
)
from durable_assets.kit.runtime import metadata as kit_tables
from durable_assets.ops.settings import RetentionSettings
from durable_assets.ops.status_model import BatchStatus

DAY_S = 86_400.0
ARCHIVE_FORMAT = 1
#: Lease owner shared by every pruner, so a re-run after a crash adopts its predecessor's leases.
RETENTION_OWNER = "durable-retention"
#: Long enough to archive and delete one chunk; a crashed pruner blocks a resume for at most this.
RETENTION_LEASE_TTL_S = 600.0
#: Lineages archived, then deleted, per round; bounds the work a crash can leave to the next prune.
CHUNK_SIZE = 200
#: Event rows read per query while archiving.
EVENT_PAGE = 1000
_IN_CLAUSE = 400  # SQLite's bound-parameter limit is 32766 (999 on old builds); stay well below
_ASSET_EVENTS = (DagsterEventType.ASSET_MATERIALIZATION.value, DagsterEventType.ASSET_OBSERVATION.value)
#: Events that name an asset a run planned or wrote: a step's output is stored under that asset.
_PLANNED_OR_STORED = (
    DagsterEventType.ASSET_MATERIALIZATION_PLANNED.value,
    DagsterEventType.ASSET_MATERIALIZATION.value,
)
T = TypeVar("T")
_log = logging.getLogger(__name__)


#: Declared once, with the retention variables (durable_assets/ops/settings.py).
_DEFAULTS = RetentionSettings()


@dataclass(frozen=True)
class RetentionPolicy:
    """How long finished lineages and idempotency keys are kept, in days."""

    completed_days: float = _DEFAULTS.completed_days
    failed_days: float = _DEFAULTS.failed_days
    ledger_days: float = _DEFAULTS.ledger_days

    def __post_init__(self) -> None:
        for name, where in (
            ("completed_days", "--completed-days / DURABLE_RETENTION_COMPLETED_DAYS"),
            ("failed_days", "--failed-days / DURABLE_RETENTION_FAILED_DAYS"),
            ("ledger_days", "--ledger-days / DURABLE_LEDGER_RETENTION_DAYS"),
        ):
            value = getattr(self, name)
            if not value >= 0 or value == float("inf"):  # also rejects NaN
                raise UsageError(f"{where} must be a number of days >= 0, got {value}")

    def horizon_days(self, status: BatchStatus) -> float:
        return self.completed_days if status == BatchStatus.SUCCEEDED else self.failed_days


@dataclass
class Lineage:
    """One batch: every run carrying the batch tag, oldest first."""

    batch_id: str
    records: list[RunRecord]

    @property
    def run_ids(self) -> list[str]:
        return [r.dagster_run.run_id for r in self.records]

    @property
    def in_progress(self) -> bool:
        return any(not BatchStatus.of_run(r.dagster_run.status).terminal for r in self.records)

    @property
    def status(self) -> BatchStatus:
        """The newest run's status word; terminal once ``in_progress`` is false, the only time a
        lineage is archived or reported."""
        return BatchStatus.of_run(self.records[-1].dagster_run.status)

    @property
    def ended_at(self) -> float | None:
        newest = self.records[-1]
        if newest.end_time is not None:
            return newest.end_time
        return newest.update_timestamp.timestamp() if newest.update_timestamp else None

    @property
    def archive_name(self) -> str:
        """Deterministic per lineage: a later batch reusing the ID gets its own archive."""
        return f"{self.batch_id}--{self.run_ids[0]}.jsonl.gz"


@dataclass
class PruneReport:
    dry_run: bool
    archive_dir: str
    policy: RetentionPolicy
    batches: list[dict[str, Any]] = field(default_factory=list)
    skipped: list[dict[str, str]] = field(default_factory=list)
    in_progress: list[str] = field(default_factory=list)
    ledger_keys: int = 0
    seconds: float = 0.0
    #: Stored objects (files, ``durable_blobs`` rows, S3 objects) of pruned batches deleted, and bytes.
    stored: Purged = field(default_factory=Purged)

    @property
    def runs(self) -> int:
        return sum(b["runs"] for b in self.batches)

    def as_dict(self) -> dict[str, Any]:
        return {
            "dry_run": self.dry_run,
            "archive_dir": self.archive_dir,
            "policy": {
                "completed_days": self.policy.completed_days,
                "failed_days": self.policy.failed_days,
                "ledger_days": self.policy.ledger_days,
            },
            "batches": self.batches,
            "skipped": self.skipped,
            "in_progress": self.in_progress,
            "runs_pruned": 0 if self.dry_run else self.runs,
            "ledger_keys_pruned": self.ledger_keys,
            "stored_objects_deleted": self.stored.objects,
            "stored_bytes_deleted": self.stored.bytes,
            "seconds": round(self.seconds, 3),
            "runs_per_s": round(self.runs / self.seconds, 1) if self.seconds and not self.dry_run else None,
        }


# --- finding lineages ----------------------------------------------------------------------------


def _bulk_event_log(instance: DagsterInstance) -> SqlEventLogStorage | None:
    """Dagster's SQL event log if its tables may be read and written directly, else None."""
    storage = instance.event_log_storage
    if isinstance(storage, SqlEventLogStorage) and is_verified_version():
        return storage
    return None


def _bulk_run_storage(instance: DagsterInstance) -> SqlRunStorage | None:
    """Dagster's SQL run storage if its tables may be written directly, else None."""
    storage = instance.run_storage
    if isinstance(storage, SqlRunStorage) and is_verified_version():
        return storage
    return None


def _chunks(items: Sequence[T], size: int) -> Iterator[Sequence[T]]:
    for i in range(0, len(items), size):
        yield items[i : i + size]


def find_lineages(
    instance: DagsterInstance, batch_tag: str, batch_ids: Iterable[str] | None = None
) -> dict[str, Lineage]:
    """Every lineage in run storage (or just ``batch_ids``), by batch ID."""
    if batch_ids is None:
        ids = sorted({v for _key, values in instance.get_run_tags(tag_keys=[batch_tag]) for v in values})
    else:
        ids = sorted(set(batch_ids))
    found: dict[str, list[RunRecord]] = {}
    for chunk in _chunks(ids, _IN_CLAUSE):
        for record in instance.get_run_records(RunsFilter(tags={batch_tag: list(chunk)})):
            found.setdefault(record.dagster_run.tags[batch_tag], []).append(record)
    return {
        bid: Lineage(bid, sorted(recs, key=lambda r: r.storage_id)) for bid, recs in sorted(found.items())
    }


def due(lineage: Lineage, policy: RetentionPolicy, at: float) -> bool:
    """Finished, and its newest run ended longer ago than the policy keeps that outcome."""
    if lineage.in_progress:
        return False
    ended = lineage.ended_at
    return ended is not None and ended <= at - policy.horizon_days(lineage.status) * DAY_S


# --- archives ------------------------------------------------------------------------------------


def _line(obj: dict[str, Any]) -> bytes:
    return (json.dumps(obj, separators=(",", ":"), default=str) + "\n").encode()


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _publish(tmp: Path, final: Path) -> None:
    """The rename that makes an archive exist; a crash before it leaves only a temporary file."""
    crash_point(CrashPoint.ARCHIVE_WRITTEN)
    os.replace(tmp, final)
    crash_point(CrashPoint.ARCHIVE_RENAMED)


def write_archive(
    instance: DagsterInstance,
    lineage: Lineage,
    archive_dir: Path,
    status_fn: Callable[[str], dict[str, Any]] | None = None,
    page_size: int | None = None,
) -> tuple[Path, int]:
    """Write the lineage's runs, every stored event and its status JSON; return (path, events).

    The file is fsynced before the rename; the caller fsyncs the directory before deleting.
    """
    final = archive_dir / lineage.archive_name
    tmp = archive_dir / f".{lineage.archive_name}.tmp"
    events = 0
    with open(tmp, "wb") as raw:
        with gzip.GzipFile(fileobj=raw, mode="wb", mtime=0) as gz:
            gz.write(
                _line(
                    {
                        "kind": "batch",
                        "format": ARCHIVE_FORMAT,
                        "batch_id": lineage.batch_id,
                        "status": lineage.status,
                        "ended_at": lineage.ended_at,
                        "run_ids": lineage.run_ids,
                        "archived_at": now(),
                    }
                )
            )
            for record in lineage.records:
                gz.write(
                    _line(
                        {
                            "kind": "run",
                            "run_id": record.dagster_run.run_id,
                            "status": record.dagster_run.status.value,
                            "create_timestamp": record.create_timestamp.timestamp(),
                            "start_time": record.start_time,
                            "end_time": record.end_time,
                            "dagster_run": serialize_value(record.dagster_run),
                        }
                    )
                )
            for run_id, storage_id, event in _stored_events(
                instance, lineage.run_ids, page_size or EVENT_PAGE
            ):
                gz.write(_line({"kind": "event", "run_id": run_id, "storage_id": storage_id, "event": event}))
                events += 1
            if status_fn is not None:
                gz.write(_line({"kind": "status", "status": status_fn(lineage.batch_id)}))
            gz.write(_line({"kind": "end", "runs": len(lineage.records), "events": events}))
        raw.flush()
        os.fsync(raw.fileno())
    _publish(tmp, final)
    return final, events


def _stored_events(
    instance: DagsterInstance, run_ids: Sequence[str], page_size: int
) -> Iterator[tuple[str, int, str]]:
    """(run id, storage id, serialized EventLogEntry) for every event of these runs, in order.

    The event column already holds Dagster's serdes JSON, so it is copied as stored rather than
    deserialized and serialized again, and streamed ``page_size`` rows at a time. Per-run SQLite
    shards are read with a plain connection: Dagster's own opens each shard with an
    alembic revision check (~0.2 s a shard), which would dominate the prune. Without the bulk
    path, the same records in the same pages come from the public API.
    """
    storage = _bulk_event_log(instance)
    if storage is None:
        for run_id in run_ids:
            yield from _public_paged_events(instance, run_id, page_size)
        return
    opened: set[str] = getattr(storage, "_initialized_dbs", set())
    for run_id in run_ids:
        if not storage.is_run_sharded:
            yield from _paged_events(storage.index_connection, run_id, page_size)
            continue
        path = storage.path_for_shard(run_id)  # type: ignore[attr-defined]
        if not os.path.exists(path):
            continue  # a run that never logged an event has no shard
        engine = sa.create_engine(f"sqlite:///{path}", poolclass=sa.pool.NullPool)
        try:
            yield from _paged_events(engine.connect, run_id, page_size)
        finally:
            engine.dispose()
        opened.add(run_id)  # it exists with its tables: spare Dagster's check if status_fn reads it


def asset_paths_named(instance: DagsterInstance, run_ids: Sequence[str]) -> set[tuple[str, ...]]:
    """The asset paths these runs' events name (planned or materialized): the assets whose outputs
    their steps may have stored, a distributed run's shard steps among them.

    Read as :func:`_stored_events` reads (a plain connection per SQLite shard). A run whose shard is
    gone names none: its events were deleted by a prune killed before its run was, and its stored
    data went before its events.
    """
    paths: set[tuple[str, ...]] = set()
    storage = _bulk_event_log(instance)
    if storage is None:
        for run_id in run_ids:
            for entry in instance.all_logs(run_id, of_type={DagsterEventType(t) for t in _PLANNED_OR_STORED}):
                key = entry.dagster_event.asset_key if entry.dagster_event else None
                if key is not None:
                    paths.add(tuple(key.path))
        return paths
    t = SqlEventLogStorageTable.c
    for run_id in run_ids:
        query = sa.select(t.event).where(t.run_id == run_id, t.dagster_event_type.in_(_PLANNED_OR_STORED))
        if not storage.is_run_sharded:
            with storage.index_connection() as conn:
                rows = list(conn.execute(query).scalars())
        else:
            path = storage.path_for_shard(run_id)  # type: ignore[attr-defined]
            if not os.path.exists(path):
                continue
            engine = sa.create_engine(f"sqlite:///{path}", poolclass=sa.pool.NullPool)
            try:
                with engine.connect() as conn:
                    rows = list(conn.execute(query).scalars())
            finally:
                engine.dispose()
        for raw in rows:
            event = deserialize_value(raw, EventLogEntry).dagster_event
            if event is not None and event.asset_key is not None:
                paths.add(tuple(event.asset_key.path))
    return paths


def _public_paged_events(
    instance: DagsterInstance, run_id: str, page_size: int
) -> Iterator[tuple[str, int, str]]:
    cursor: str | None = None
    while True:
        page = instance.get_records_for_run(run_id, cursor=cursor, limit=page_size)
        for record in page.records:
            yield run_id, record.storage_id, serialize_value(record.event_log_entry)
        if not page.has_more:
            return
        cursor = page.cursor


def _paged_events(
    connect: Callable[[], contextlib.AbstractContextManager[Any]], run_id: str, page_size: int
) -> Iterator[tuple[str, int, str]]:
    """Keyset pages by storage id: bounded memory, and no server-side cursor (Dagster's Postgres
    connections autocommit, where psycopg2 cannot hold one)."""
    table = SqlEventLogStorageTable
    last = -1
    while True:
        query = (
            sa.select(table.c.id, table.c.event)
            .where(table.c.run_id == run_id, table.c.id > last)
            .order_by(table.c.id)
            .limit(page_size)
        )
        with connect() as conn:
            rows = conn.execute(query).all()
        for storage_id, event in rows:
            yield run_id, storage_id, event
        if len(rows) < page_size:
            return
        last = rows[-1][0]


def read_archive(path: Path) -> Iterator[dict[str, Any]]:
    """The archive's records in order; gzip's CRC check fails loudly on a damaged file."""
    with gzip.open(path, "rb") as gz:
        for raw_line in gz:
            yield json.loads(raw_line)


def complete_archive(path: Path, lineage: Lineage) -> int | None:
    """Events in an existing archive of exactly this lineage, or None if absent or incomplete."""
    if not path.exists():
        return None
    try:
        records = list(read_archive(path))
    except (OSError, EOFError, ValueError):
        return None
    if not records or records[0].get("kind") != "batch" or records[-1].get("kind") != "end":
        return None
    if records[0]["run_ids"] != lineage.run_ids:
        raise ArchiveError(
            f"{path} holds runs {records[0]['run_ids']} but batch {lineage.batch_id!r} now has "
            f"{lineage.run_ids}; move the file aside after checking it, then prune again"
        )
    return int(records[-1]["events"])


# --- bulk deletes --------------------------------------------------------------------------------


def _delete_event_logs(instance: DagsterInstance, run_ids: Sequence[str]) -> None:
    """What ``delete_events`` does per run, as a few statements per chunk.

    On the run-sharded SQLite store the per-run shard file is removed outright (Dagster leaves
    it, emptied, on disk); the index shard keeps only mirrored asset and run-status events.
    """
    storage = _bulk_event_log(instance)
    if storage is None:
        for run_id in run_ids:
            instance.event_log_storage.delete_events(run_id)
        return
    for chunk in _chunks(run_ids, _IN_CLAUSE):
        with storage.index_connection() as conn:
            asset_event_ids = sa.select(SqlEventLogStorageTable.c.id).where(
                SqlEventLogStorageTable.c.run_id.in_(chunk),
                SqlEventLogStorageTable.c.dagster_event_type.in_(_ASSET_EVENTS),
            )
            conn.execute(
                AssetEventTagsTable.delete().where(AssetEventTagsTable.c.event_id.in_(asset_event_ids))
            )
            conn.execute(SqlEventLogStorageTable.delete().where(SqlEventLogStorageTable.c.run_id.in_(chunk)))
            holding_slots: set[str] = set()
            if storage.supports_global_concurrency_limits:
                for table in (ConcurrencySlotsTable, PendingStepsTable):
                    query = sa.select(table.c.run_id).where(table.c.run_id.in_(chunk)).distinct()
                    holding_slots.update(conn.execute(query).scalars())
        for run_id in holding_slots:  # rare: keep Dagster's slot hand-over logic
            storage.free_concurrency_slots_for_run(run_id)
    if storage.is_run_sharded:
        # Other processes that opened a removed shard read "no such table" for it until its run
        # row goes too (moments later, or at the next prune after a crash); nothing else reads it.
        path_for_shard = storage.path_for_shard  # type: ignore[attr-defined]
        opened: set[str] = getattr(storage, "_initialized_dbs", set())
        for run_id in run_ids:
            for suffix in ("", "-wal", "-shm"):
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(path_for_shard(run_id) + suffix)
            opened.discard(run_id)  # so this process would recreate, not misread, the shard


def _delete_partitions(instance: DagsterInstance, partitions_def_name: str, keys: Sequence[str]) -> None:
    storage = _bulk_event_log(instance)
    if storage is None:
        for key in keys:
            instance.delete_dynamic_partition(partitions_def_name, key)
        return
    t = DynamicPartitionsTable.c
    for chunk in _chunks(keys, _IN_CLAUSE):
        with storage.index_connection() as conn:
            conn.execute(
                DynamicPartitionsTable.delete().where(
                    t.partitions_def_name == partitions_def_name, t.partition.in_(chunk)
                )
            )


def _delete_own_rows(db: DurableDatabase, batch_ids: Sequence[str]) -> None:
    """Every table of ours keyed by batch (leases, cancels, progress, outboxes, ...), in one go.

    The idempotency ledger has no batch column on purpose: keys outlive runs.
    """
    tables = [t for t in kit_tables.sorted_tables if "batch_id" in t.c]
    for chunk in _chunks(batch_ids, _IN_CLAUSE):
        with db.transaction() as conn:
            for table in reversed(tables):  # children before parents, should FKs appear
                conn.execute(table.delete().where(table.c.batch_id.in_(chunk)))


def _delete_runs(instance: DagsterInstance, run_ids: Sequence[str]) -> None:
    """The last step: a lineage disappears from run storage in one transaction per chunk.

    Without the bulk path, ``instance.delete_run`` per run: it deletes the run, then its events
    (already gone, so run storage is still the last thing to change).
    """
    storage = _bulk_run_storage(instance)
    if storage is None:
        for run_id in run_ids:
            instance.delete_run(run_id)
        return
    for chunk in _chunks(run_ids, _IN_CLAUSE):
        with storage.connect() as conn:
            conn.execute(RunTagsTable.delete().where(RunTagsTable.c.run_id.in_(chunk)))
            conn.execute(RunsTable.delete().where(RunsTable.c.run_id.in_(chunk)))


def prune_ledger(db: DurableDatabase, days: float, at: float, dry_run: bool = False) -> int:
    """Drop idempotency keys older than their horizon. Keys whose outcome is unknown (an intent
    with no recorded result) are kept: forgetting them could let a new request repeat an effect.
    """
    cutoff = at - days * DAY_S
    c = idempotency.c
    where = sa.and_(c.created_at < cutoff, c.updated_at < cutoff, c.recovery_point != STARTED)
    with db.transaction() as conn:
        if dry_run:
            return int(conn.execute(sa.select(sa.func.count()).where(where)).scalar_one())
        deleted = int(conn.execute(idempotency.delete().where(where)).rowcount)
        # A subject is held exactly as long as the key that claimed it.
        s = effect_subjects.c
        holder_kept = sa.exists().where(c.account == s.account, c.scope == s.scope, c.key == s.key)
        conn.execute(effect_subjects.delete().where(s.created_at < cutoff, ~holder_kept))
        return deleted


# --- the prune -----------------------------------------------------------------------------------


@contextlib.contextmanager
def _exclusive(archive_dir: Path) -> Iterator[None]:
    with open(archive_dir / ".prune.lock", "w") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError as exc:
            raise PruneInProgressError(
                f"another prune is running on {archive_dir}; wait for it to finish"
            ) from exc
        yield


def _iso(ts: float | None) -> str | None:
    return datetime.fromtimestamp(ts, tz=UTC).isoformat().replace("+00:00", "Z") if ts else None


def _where(lineage: Lineage, archive_dir: Path, store: BatchStorage | None) -> str:
    return store.uri(lineage.archive_name) if store is not None else str(archive_dir / lineage.archive_name)


def _entry(lineage: Lineage, archive: str | None, events: int | None) -> dict[str, Any]:
    return {
        "id": lineage.batch_id,
        "status": lineage.status,
        "ended_at": _iso(lineage.ended_at),
        "runs": len(lineage.records),
        "events": events,
        "archive": str(archive) if archive else None,
    }


class _Skip(Exception):
    """This lineage is left alone in this prune (the reason is reported)."""


@contextlib.contextmanager
def _nothing_deleted(errors: type[Exception], what: str, then: str) -> Iterator[None]:
    """``errors`` inside become an :class:`ArchiveError` saying ``what`` failed, that nothing was
    deleted, and ``then`` what to do.

    Why one place: every failure before a lineage's archive is checked stored stops the prune of
    that lineage with its rows intact, and the operator reads the same sentence for each step.
    """
    try:
        yield
    except errors as exc:
        raise ArchiveError(f"{what}: {exc}. Nothing was deleted; {then}") from exc


def _archive_one(
    instance: DagsterInstance,
    lineage: Lineage,
    archive_dir: Path,
    status_fn: Callable[[str], dict[str, Any]] | None,
    store: BatchStorage | None = None,
) -> tuple[Lineage, str, int]:
    """Find the lineage's complete archive from an interrupted prune, or write it; return where.

    With ``store`` (an object store), the archive is written and fsynced in ``archive_dir`` as
    always, then stored whole (one atomic PUT), read back and checked complete before anything of
    the lineage may be deleted; only then is the local copy removed. A crash at any point leaves
    the store without the object or with all of it, and the lineage's rows in place until it is.
    """
    path = archive_dir / lineage.archive_name
    if store is not None:
        with _nothing_deleted(
            StorageError,
            f"cannot reach the archive store for batch {lineage.batch_id!r}",
            "check DURABLE_ARCHIVE_DIR and DURABLE_S3_*, then prune again.",
        ):
            events = _stored_complete(store, archive_dir, lineage)
        if events is not None:  # stored by an interrupted prune: its local copy is no longer needed
            path.unlink(missing_ok=True)
            return lineage, store.uri(lineage.archive_name), events
    try:
        events = complete_archive(path, lineage)
    except ArchiveError as exc:
        raise _Skip(str(exc)) from exc
    if events is None:
        with _nothing_deleted(
            OSError,
            f"cannot write the archive of batch {lineage.batch_id!r} in {archive_dir}",
            "free space or set another archive directory, then prune again.",
        ):
            path, events = write_archive(instance, lineage, archive_dir, status_fn)
    if store is None:
        return lineage, str(path), events
    with _nothing_deleted(
        StorageError,
        f"cannot store the archive of batch {lineage.batch_id!r}",
        f"the archive stays in {archive_dir} and the next prune stores it again.",
    ):
        store.put(lineage.archive_name, path.read_bytes())
    crash_point(CrashPoint.ARCHIVE_STORED)
    with _nothing_deleted(
        StorageError, f"cannot read back the stored archive of batch {lineage.batch_id!r}", "prune again."
    ):
        checked = _stored_complete(store, archive_dir, lineage)
    if checked != events:
        raise ArchiveError(
            f"the stored archive {store.uri(lineage.archive_name)} of batch {lineage.batch_id!r} reads "
            f"back {checked} events, not {events}; nothing was deleted, prune again"
        )
    path.unlink()
    return lineage, store.uri(lineage.archive_name), events


def _stored_complete(store: BatchStorage, archive_dir: Path, lineage: Lineage) -> int | None:
    """Events in the store's complete archive of this lineage (read back whole), else None."""
    data = store.get(lineage.archive_name)
    if data is None:
        return None
    probe = archive_dir / f".{lineage.archive_name}.stored"
    probe.write_bytes(data)
    try:
        return complete_archive(probe, lineage)
    except ArchiveError as exc:
        raise _Skip(str(exc)) from exc
    finally:
        probe.unlink(missing_ok=True)


def _lease_chunk(
    instance: DagsterInstance,
    leases: LeaseStore,
    chunk: Sequence[Lineage],
    batch_tag: str,
    policy: RetentionPolicy,
    at: float,
    report: PruneReport,
) -> list[tuple[Lineage, Lease]]:
    """Take each lineage's lease, then re-read them all: a resume may have added a run since they
    were listed, and only what is there under the lease is archived and deleted."""
    held: dict[str, Lease] = {}
    for listed in chunk:
        try:
            held[listed.batch_id] = leases.acquire(listed.batch_id, run_id="retention", owner=RETENTION_OWNER)
        except BatchConflictError as exc:
            report.skipped.append({"id": listed.batch_id, "reason": str(exc)})
    current = find_lineages(instance, batch_tag, list(held))
    out = []
    for batch_id, lease in held.items():
        lineage = current.get(batch_id)
        if lineage is None or not due(lineage, policy, at):
            leases.release(lease)
            report.skipped.append(
                {"id": batch_id, "reason": "changed while pruning; left for the next prune"}
            )
        else:
            out.append((lineage, lease))
    return out


def prune(
    instance: DagsterInstance,
    policy: RetentionPolicy,
    archive_dir: Path,
    *,
    batch_tag: str,
    partitions_def_names: Sequence[str] = (),
    status_fn: Callable[[str], dict[str, Any]] | None = None,
    dry_run: bool = False,
    at: float | None = None,
    chunk_size: int | None = None,
    archive_store: BatchStorage | None = None,
    delete_stored: Callable[[Sequence[Lineage]], Purged] | None = None,
) -> PruneReport:
    """Archive, then delete, every finished lineage older than the policy; prune the ledger.

    Lineages are handled in chunks: archive each (or find its complete archive from an earlier,
    interrupted prune), fsync the directory once, then delete the chunk's stored data
    (``delete_stored``: outputs and files in the batch storage), then bulk-delete its events,
    dynamic partitions, our batch rows and finally its runs. With ``archive_store`` (an S3 bucket), the
    archives end up there, each checked stored and complete before its lineage is deleted, and
    ``archive_dir`` is only where they are written first.
    """
    started = time.perf_counter()
    at = now() if at is None else at
    archive_dir = Path(archive_dir)
    report = PruneReport(dry_run, archive_store.location if archive_store else str(archive_dir), policy)
    db = DurableDatabase.for_instance(instance)
    lineages = find_lineages(instance, batch_tag)
    report.in_progress = [b for b, lin in lineages.items() if lin.in_progress]
    candidates = [lin for lin in lineages.values() if due(lin, policy, at)]
    if dry_run:
        report.batches = [_entry(lin, _where(lin, archive_dir, archive_store), None) for lin in candidates]
        report.ledger_keys = prune_ledger(db, policy.ledger_days, at, dry_run=True)
        report.seconds = time.perf_counter() - started
        return report

    archive_dir.mkdir(parents=True, exist_ok=True)
    if not is_verified_version():
        _log.warning(
            "Dagster %s is not %s, whose tables retention's bulk delete was verified with: "
            "deleting run by run through the public API (slower; SQLite shard files stay)",
            INSTALLED_DAGSTER_VERSION,
            VERIFIED_DAGSTER_VERSION,
        )
    leases = LeaseStore(db, ttl_s=RETENTION_LEASE_TTL_S)
    with _exclusive(archive_dir):
        for chunk in _chunks(candidates, chunk_size or CHUNK_SIZE):
            ready: list[tuple[Lineage, str, int]] = []
            leased = _lease_chunk(instance, leases, chunk, batch_tag, policy, at, report)
            try:
                for lineage, lease in leased:
                    try:
                        ready.append(_archive_one(instance, lineage, archive_dir, status_fn, archive_store))
                    except _Skip as skip:
                        leases.release(lease)
                        report.skipped.append({"id": lineage.batch_id, "reason": str(skip)})
            except BaseException:
                for _lineage, lease in leased:  # let resumes in again; archives already written stay
                    leases.release(lease)
                raise
            if not ready:
                continue
            _fsync_dir(archive_dir)
            if delete_stored is not None:  # first: see the module docstring's rule 2
                report.stored += delete_stored([lin for lin, _, _ in ready])
                crash_point(CrashPoint.BATCH_DATA_DELETED)
            run_ids = [rid for lin, _, _ in ready for rid in lin.run_ids]
            batch_ids = [lin.batch_id for lin, _, _ in ready]
            _delete_event_logs(instance, run_ids)
            for partitions_def_name in partitions_def_names:  # a batch is a partition of its job's only
                _delete_partitions(instance, partitions_def_name, batch_ids)
            _delete_own_rows(db, batch_ids)  # also drops the leases taken above
            _delete_runs(instance, run_ids)
            crash_point(CrashPoint.BATCH_DELETED)
            report.batches.extend(_entry(lin, path, events) for lin, path, events in ready)
        report.ledger_keys = prune_ledger(db, policy.ledger_days, at)
    report.seconds = time.perf_counter() - started
    return report
