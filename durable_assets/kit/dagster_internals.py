"""Dagster's private names, behind one door: the only module that imports ``dagster._``.

Dagster promises nothing about its underscore modules, and a minor release moves or reshapes them.
So every private name the kit and the operations layer use is imported here, and nowhere else;
each is listed in :data:`REASONS` with why we need it and the public API that would replace it; and
``tests/kit/test_dagster_internals.py`` checks each one's signature and attributes, so that a
Dagster upgrade fails there, by name, instead of deep inside a crash test.

:data:`VERIFIED_DAGSTER_VERSION` is the release all of this was read against. Code that relies on
more than a name (retention deletes rows from Dagster's own tables) asks :func:`is_verified_version`
and falls back to the public API on any other release. To upgrade: bump the pin, run the contract
tests, compare each failing name with the new release, then bump this constant.

Names that Dagster exports publicly (``dagster.DagsterEvent``, ``dagster.DagsterRunStatus``,
``dagster.DefaultRunLauncher``, ...) are imported from ``dagster`` where they are used, not here.
"""

from __future__ import annotations

import functools
import os
import threading
from collections import OrderedDict
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import dagster
from dagster._config.pythonic_config import resource as _pythonic_resource
from dagster._core.definitions.reconstruct import ReconstructableJob
from dagster._core.definitions.unresolved_asset_job_definition import UnresolvedAssetJobDefinition
from dagster._core.event_api import EventLogCursor
from dagster._core.events import EngineEventData
from dagster._core.execution.api import create_execution_plan, execute_plan_iterator
from dagster._core.execution.compute_logs import redirect_to_file
from dagster._core.execution.context.system import PlanOrchestrationContext
from dagster._core.execution.plan.active import ActiveExecution
from dagster._core.execution.plan.instance_concurrency_context import InstanceConcurrencyContext
from dagster._core.execution.plan.plan import ExecutionPlan
from dagster._core.execution.plan.state import KnownExecutionState
from dagster._core.execution.retries import RetryMode, get_retries_config
from dagster._core.instance.ref import compute_logs_directory
from dagster._core.launcher import CheckRunHealthResult, LaunchRunContext, WorkerStatus
from dagster._core.storage.compute_log_manager import CapturedLogContext, ComputeIOType
from dagster._core.storage.event_log.schema import (
    AssetEventTagsTable,
    ConcurrencySlotsTable,
    DynamicPartitionsTable,
    PendingStepsTable,
    SqlEventLogStorageTable,
)
from dagster._core.storage.event_log.sql_event_log import SqlEventLogStorage
from dagster._core.storage.event_log.sqlite.sqlite_event_log import INDEX_SHARD_NAME, SqliteEventLogStorage
from dagster._core.storage.local_compute_log_manager import IO_TYPE_EXTENSION, LocalComputeLogManager
from dagster._core.storage.runs.schema import RunsTable, RunTagsTable
from dagster._core.storage.runs.sql_run_storage import SqlRunStorage
from dagster._core.storage.runs.sqlite.sqlite_run_storage import SqliteRunStorage
from dagster._core.storage.schedules.sqlite.sqlite_schedule_storage import SqliteScheduleStorage
from dagster._core.storage.sqlite import SQLITE_BUSY_TIMEOUT_SECONDS
from dagster._core.storage.tags import (
    AUTO_RETRY_RUN_ID_TAG,
    MAX_RETRIES_TAG,
    PARENT_RUN_ID_TAG,
    RESUME_RETRY_TAG,
    RETRY_NUMBER_TAG,
    ROOT_RUN_ID_TAG,
    RUN_FAILURE_REASON_TAG,
    WILL_RETRY_TAG,
)
from dagster._grpc.types import ExecuteStepArgs
from dagster._serdes import pack_value, unpack_value
from dagster._utils.error import SerializableErrorInfo, serializable_error_info_from_exc_info
from sqlalchemy import create_engine
from sqlalchemy.engine import Connection, Engine
from sqlalchemy.pool import NullPool

#: The Dagster release every name below (and retention's bulk delete) was checked against.
VERIFIED_DAGSTER_VERSION = "1.13.27"
#: The release this process runs.
INSTALLED_DAGSTER_VERSION: str = dagster.__version__


def is_verified_version() -> bool:
    """Whether the installed Dagster is the one whose storage layout was verified.

    A name that moves fails at import; a table whose meaning changes does not. Code that writes
    to Dagster's storage directly asks this first and takes the public API otherwise.
    """
    return INSTALLED_DAGSTER_VERSION == VERIFIED_DAGSTER_VERSION


#: Methods of Dagster's SQL storages that ask the database's catalog (SQLAlchemy reflection: two to
#: five queries) whether a migration has run, on every call: ``has_table("dynamic_partitions")`` on
#: every dynamic-partition check, the asset-key columns on every ``get_asset_records`` (twice),
#: the runs table's columns on every ``get_run_records``. A worker task made ~16 such checks, 13% of
#: its time in a profile (docs/benchmarks.md, scenario 10). A migration only adds tables and columns,
#: so a True answer holds for the life of the process; a False one is asked again (a `dagster instance
#: migrate` while workers run is then seen). Dagster's own Postgres storages keep ``has_secondary_index``
#: (both answers) for the process's life the same way. Storage attribute of the instance -> methods.
SCHEMA_CHECKS: dict[str, tuple[str, ...]] = {
    "event_log_storage": ("has_table", "has_asset_key_col"),
    "run_storage": ("has_run_stats_index_cols",),
}


def remember_schema_checks(instance: dagster.DagsterInstance) -> None:
    """Keep each True answer of this instance's :data:`SCHEMA_CHECKS` (for a long-lived process).

    Wraps the methods on this instance's storage objects only (their classes are untouched), so an
    instance a short command opens keeps asking. Idempotent; a storage without the method is skipped.
    """
    for storage_attr, methods in SCHEMA_CHECKS.items():
        storage = getattr(instance, storage_attr)
        for name in methods:
            method = getattr(storage, name, None)
            if method is None or getattr(method, _REMEMBERED, False):
                continue
            setattr(storage, name, remember_true(method))


#: What a per-run SQLite event-log shard (``SqliteEventLogStorage``, one file per run) needs to be
#: read without its schema check: the set of shards this process already checked, and the file's path.
SHARD_ATTRIBUTES = ("_initialized_dbs", "path_for_shard")


def skip_shard_checks(instance: dagster.DagsterInstance, run_ids: Iterable[str]) -> set[str]:
    """Read the event logs of ``run_ids`` without Dagster's per-shard schema check; the runs marked.

    On a SQLite instance each run's events live in a file of their own, and the first read of each
    in a process runs alembic's revision check, which loads alembic's ~90 migration scripts anew:
    ~20 ms per run, 40 of the ~45 ms a `job list` row cost. A shard file with content was created
    and stamped by the process that wrote its events (its ``_initdb`` runs before the first write),
    and a reader changes nothing in it, so the check tells a reader nothing. Only for the verified
    Dagster release; another storage (Postgres: one table) or an empty or absent file is left to
    Dagster. A reader whose read still fails calls :func:`check_shard_again` and reads again.
    """
    storage = instance.event_log_storage
    checked = getattr(storage, SHARD_ATTRIBUTES[0], None)
    path_for_shard = getattr(storage, SHARD_ATTRIBUTES[1], None)
    if not is_verified_version() or not isinstance(checked, set) or path_for_shard is None:
        return set()
    marked: set[str] = set()
    for run_id in run_ids:
        if run_id in checked:
            continue
        try:
            written = os.path.getsize(path_for_shard(run_id)) > 0
        except OSError:
            written = False
        if written:
            checked.add(run_id)
            marked.add(run_id)
    return marked


def check_shard_again(instance: dagster.DagsterInstance, run_id: str) -> None:
    """Undo :func:`skip_shard_checks` for one run: its next read checks (and creates) its shard."""
    checked = getattr(instance.event_log_storage, SHARD_ATTRIBUTES[0], None)
    if isinstance(checked, set):
        checked.discard(run_id)


#: How many run shards' engines one SQLite event log keeps besides its index shard's: the runs a
#: process writes or read last (a run writes to one; `job serve` reads a page of them at a time).
KEPT_SHARD_ENGINES = 16
#: Set on a SQLite storage object once :func:`keep_sqlite_engines` has replaced its connect method.
_ENGINES_KEPT = "_durable_keeps_engines"


def keep_sqlite_engines(instance: dagster.DagsterInstance) -> None:
    """Build each SQLite storage file's SQLAlchemy engine once per process, not once per statement.

    Dagster's SQLite storages call ``create_engine`` for every connection they open and drop the
    engine after it. A new engine starts with an empty compiled-statement cache and an uninitialised
    dialect, so each of a run's ~100 events compiled its INSERT anew (and the asset and check events
    their index-shard writes too): 332 engines for one demo batch, ~0.16 s of a 4.3 s `job run`
    (alternating runs with and without, docs/benchmarks.md). Kept here: the run storage's and the
    schedule storage's engine, and the event log's per shard (its index and the last
    :data:`KEPT_SHARD_ENGINES` runs). The connections are what Dagster's are: ``NullPool``, one
    opened per use and closed after it, the same busy timeout, one transaction per use, the event
    log's lock held around it. Nothing stays open between statements, so other processes' writes, a
    worker's forked pool children and a pruned run's file behave as before. Wraps this instance's
    storage objects only (an instance a short command opens is untouched); idempotent; for the
    verified Dagster release only.
    """
    if not is_verified_version():
        return
    for storage in (instance.run_storage, instance.schedule_storage):
        if isinstance(storage, (SqliteRunStorage, SqliteScheduleStorage)) and not getattr(
            storage, _ENGINES_KEPT, False
        ):
            storage.connect = _connect_with_one_engine(storage._conn_string)  # type: ignore[method-assign]
            setattr(storage, _ENGINES_KEPT, True)
    events = instance.event_log_storage
    if isinstance(events, SqliteEventLogStorage) and not getattr(events, _ENGINES_KEPT, False):
        events._connect = _connect_with_kept_shard_engines(events)  # type: ignore[method-assign, assignment]
        setattr(events, _ENGINES_KEPT, True)


def _connect_with_one_engine(conn_string: str) -> Callable[[], Any]:
    """``SqliteRunStorage.connect`` (and the schedule storage's), with its engine built once."""
    engine = create_engine(conn_string, poolclass=NullPool)

    @contextmanager
    def connect() -> Iterator[Connection]:
        with engine.connect() as conn, conn.begin():
            yield conn

    return connect


def _connect_with_kept_shard_engines(storage: SqliteEventLogStorage) -> Callable[[str], Any]:
    """``SqliteEventLogStorage._connect`` with each shard's engine kept (the most recent ones)."""
    engines: OrderedDict[str, Engine] = OrderedDict()

    @contextmanager
    def connect(shard: str) -> Iterator[Connection]:
        with storage._db_lock:
            engine = engines.pop(shard, None) or create_engine(
                storage.conn_string_for_shard(shard),
                poolclass=NullPool,
                connect_args={"timeout": SQLITE_BUSY_TIMEOUT_SECONDS},
            )
            engines[shard] = engine  # the most recent last
            runs = [name for name in engines if name != INDEX_SHARD_NAME]
            if len(runs) > KEPT_SHARD_ENGINES:
                engines.pop(runs[0]).dispose()
            if shard not in storage._initialized_dbs:
                storage._initdb(engine)
                storage._initialized_dbs.add(shard)
            with engine.connect() as conn, conn.begin():
                yield conn

    return connect


#: Set on Dagster's pythonic-resource module once :func:`remember_config_schemas` has wrapped it.
_SCHEMAS_REMEMBERED = "_durable_remembers_config_schemas"


def remember_config_schemas() -> None:
    """Infer each resource class's config schema once per process, not on every construction.

    Dagster builds a ``ConfigurableResource`` anew for every step it initialises resources for
    (``_with_updated_values`` calls the class again), and each construction infers the class's
    Dagster config schema from its pydantic fields (``infer_schema_from_config_class``: a ``Field``
    per field, shape hashes, nested classes). A worker task initialises the run's resources once
    per step, so this was ~30 ms of a ~270 ms task in a cProfile of scenario 10's tasks, the same
    answer every time: the schema depends on the class and the fields left out, nothing else, and
    Dagster never mutates a ``Field`` once built (``_curry_config_schema`` copies it). Only the
    constructor's call is wrapped (the name in the module that uses it); a call with a description
    or a default is passed through.

    Each construction then applies its values to that schema as defaults (``_curry_config_schema``:
    the values validated against it, then a copy of it with them as its default), another ~17 ms
    a task in the same profile. That too depends only on the schema and the values, so it is kept
    per (schema, values) for the last :data:`_CURRIED_KEPT` pairs, when the values are plain
    config (scalars, lists, dicts); anything else, and any values that fail validation, are passed
    to Dagster each time, so its error is raised as before. Idempotent; for the verified Dagster
    release only.
    """
    if not is_verified_version() or getattr(_pythonic_resource, _SCHEMAS_REMEMBERED, False):
        return
    infer = _pythonic_resource.infer_schema_from_config_class
    known: dict[tuple[type, frozenset[str]], Any] = {}
    lock = threading.Lock()

    @functools.wraps(infer)
    def remembered(
        model_cls: type, description: Any = None, fields_to_omit: set[str] | None = None, default: Any = None
    ) -> Any:
        if description is not None or default is not None:
            return infer(model_cls, description, fields_to_omit, default)
        key = (model_cls, frozenset(fields_to_omit or ()))
        schema = known.get(key)
        if schema is None:
            schema = infer(model_cls, fields_to_omit=fields_to_omit)
            with lock:
                known[key] = schema
        return schema

    curry = _pythonic_resource._curry_config_schema
    curried: dict[tuple[int, Any], tuple[Any, Any]] = {}  # insertion-ordered: the oldest first

    @functools.wraps(curry)
    def curried_once(schema_field: Any, data: Any) -> Any:
        frozen = _frozen_config(data)
        if frozen is None:
            return curry(schema_field, data)
        key = (id(schema_field), frozen)
        hit = curried.get(key)
        if hit is not None and hit[0] is schema_field:  # the same schema, not a new one at its address
            return hit[1]
        result = curry(schema_field, data)  # raises on invalid values: nothing is kept then
        with lock:
            curried[key] = (schema_field, result)
            if len(curried) > _CURRIED_KEPT:
                del curried[next(iter(curried))]
        return result

    _pythonic_resource.infer_schema_from_config_class = remembered  # type: ignore[assignment]
    _pythonic_resource._curry_config_schema = curried_once
    setattr(_pythonic_resource, _SCHEMAS_REMEMBERED, True)


#: How many (schema, values) pairs :func:`remember_config_schemas` keeps: a worker's resources take
#: a few values per batch (its ID, its settings), so a long-lived worker keeps the recent ones.
_CURRIED_KEPT = 256

_SCALARS = (str, int, float, bool, type(None))


def _frozen_config(value: Any) -> Any:
    """A hashable image of plain config values, with their types (``1`` and ``True`` and ``"1"``
    differ); None for anything that is not plain config."""
    if isinstance(value, _SCALARS):
        return (type(value), value)
    if isinstance(value, dict):
        items = []
        for k, v in value.items():
            frozen = _frozen_config(v)
            if not isinstance(k, str) or frozen is None:
                return None
            items.append((k, frozen))
        return (dict, tuple(sorted(items)))
    if isinstance(value, list):
        frozen_items = tuple(_frozen_config(v) for v in value)
        return None if any(f is None for f in frozen_items) else (list, frozen_items)
    return None


_REMEMBERED = "_durable_remembers_true"


def remember_true(method: Callable[..., bool], max_entries: int | None = None) -> Callable[..., bool]:
    """``method`` answering True at once for the arguments it said True to (as they were passed:
    the same question asked by keyword and by position is asked once each).

    ``max_entries``: how many answers are kept (the oldest goes first); None keeps every one (a
    schema check has a handful of arguments).
    """
    known: dict[tuple[Any, ...], None] = {}  # insertion-ordered: the oldest first
    lock = threading.Lock()

    @functools.wraps(method)
    def remembered(*args: Any, **kwargs: Any) -> bool:
        key = (args, tuple(sorted(kwargs.items()))) if kwargs else args
        if key in known:
            return True
        answer = method(*args, **kwargs)
        if answer:
            with lock:
                known[key] = None
                if max_entries is not None and len(known) > max_entries:
                    del known[next(iter(known))]
        return answer

    setattr(remembered, _REMEMBERED, True)
    return remembered


@dataclass(frozen=True)
class Reason:
    """Why a private name is used, and what public API would replace it (or that none exists)."""

    why: str
    public: str


#: Every private name exported here: the contract tests check that this table and ``__all__`` agree.
REASONS: dict[str, Reason] = {
    # --- executing steps: the distributed executor (kit/distributed.py) --------------------------
    "ReconstructableJob": Reason(
        "A worker rebuilds the job from the orchestrator's pointer (to_dict/from_dict); "
        "ops/registry.py returns it from build_reconstructable_job.",
        "none: dagster.reconstructable/build_reconstructable_job return it but the class is private",
    ),
    "create_execution_plan": Reason(
        "A step task plans the one step it was sent; a re-execution from failure is planned "
        "without being executed (ops/reexecution.py), as Dagster's run-retry daemon does.",
        "none: execute_job(reexecution_options=...) plans and executes in one call",
    ),
    "execute_plan_iterator": Reason(
        "A step task runs its step and returns the events, as dagster-celery's task does.",
        "none: only whole-job execution (execute_job) is public",
    ),
    "PlanOrchestrationContext": Reason(
        "The context Executor.execute receives (instance, run, job, log, for_step).",
        "none: the Executor interface is public but its context type is not",
    ),
    "ActiveExecution": Reason(
        "What ExecutionPlan.start yields: the step loop asks it what to send and feeds it events.",
        "none (the loop types it Any; the contract tests check the methods it calls)",
    ),
    "InstanceConcurrencyContext": Reason(
        "Holds the run's pool concurrency slots while the loop sends steps.",
        "none",
    ),
    "ExecutionPlan": Reason("The plan Executor.execute receives; its start() drives the loop.", "none"),
    "KnownExecutionState": Reason(
        "Which steps a re-execution from failure skips (build_resume_retry_reexecution).",
        "none: ReexecutionOptions.from_failure computes it inside execute_job",
    ),
    "RetryMode": Reason("The executor's retry setting, also sent with each step.", "none"),
    "get_retries_config": Reason(
        "The executor's config schema, the same as Dagster's own executors take.",
        "none: copy the schema, and lose Dagster's changes to it",
    ),
    "ExecuteStepArgs": Reason(
        "What a step task receives (packed), the same as dagster-celery's tasks take.",
        "none",
    ),
    "pack_value": Reason(
        "Packs ExecuteStepArgs for Celery's JSON serializer.",
        "dagster_shared.serdes.pack_value (a separate package, not Dagster's public API either)",
    ),
    "unpack_value": Reason(
        "Unpacks ExecuteStepArgs in the worker.",
        "dagster_shared.serdes.unpack_value",
    ),
    "SerializableErrorInfo": Reason(
        "A lost step's failure and the errors raised from workers, as Dagster records them.",
        "dagster_shared.error.SerializableErrorInfo",
    ),
    "serializable_error_info_from_exc_info": Reason(
        "Records a worker's exception the way Dagster's executors do.",
        "none",
    ),
    "EngineEventData": Reason(
        "The payload of the engine events we write (step sent, worker, progress metadata).",
        "none: instance.report_engine_event is public but needs this payload for metadata",
    ),
    # --- reading the event log (ops/runlog.py) ---------------------------------------------------
    "EventLogCursor": Reason(
        "Starts get_records_for_run after a storage id we kept.",
        "none: the cursor string format is private; only cursors Dagster returned are public",
    ),
    # --- defining jobs (kit/job.py) --------------------------------------------------------------
    "UnresolvedAssetJobDefinition": Reason(
        "The return type of dagster.define_asset_job, for our annotation.",
        "none: define_asset_job is public, its return type is not",
    ),
    # --- run monitoring (kit/launcher.py) --------------------------------------------------------
    "CheckRunHealthResult": Reason(
        "What our launcher's check_run_worker_health answers run monitoring.",
        "none: run monitoring's launcher hook is documented but its types are private",
    ),
    "WorkerStatus": Reason("The status inside CheckRunHealthResult.", "none"),
    "LaunchRunContext": Reason("What RunLauncher.launch_run receives.", "none"),
    # --- retention's bulk delete (ops/retention/pruning.py), only on the verified version ----------------
    "SqlEventLogStorage": Reason(
        "Retention reads and deletes event rows in bulk when the event log is SQL.",
        "instance.get_records_for_run and instance.delete_run, one run at a time",
    ),
    "SqlRunStorage": Reason(
        "Retention deletes a chunk's runs in one transaction when run storage is SQL.",
        "instance.delete_run, one run at a time",
    ),
    "SqlEventLogStorageTable": Reason(
        "The event rows retention archives and deletes.", "as SqlEventLogStorage"
    ),
    "SqliteEventLogStorage": Reason(
        "keep_sqlite_engines replaces its _connect (one engine per shard file, not per statement), "
        "keeping its _db_lock, _initialized_dbs, _initdb and conn_string_for_shard as they are.",
        "none: the storage classes are private; Postgres's keep their engine already",
    ),
    "SqliteRunStorage": Reason(
        "keep_sqlite_engines replaces its connect (one engine built from its _conn_string).",
        "as SqliteEventLogStorage",
    ),
    "SqliteScheduleStorage": Reason(
        "keep_sqlite_engines replaces its connect, as the run storage's.",
        "as SqliteEventLogStorage",
    ),
    "SQLITE_BUSY_TIMEOUT_SECONDS": Reason(
        "The busy timeout Dagster's SQLite event log opens its connections with; the kept engines "
        "open theirs with the same one.",
        "none",
    ),
    "INDEX_SHARD_NAME": Reason(
        "The SQLite event log's cross-run shard, whose engine keep_sqlite_engines always keeps.",
        "none",
    ),
    "AssetEventTagsTable": Reason("Asset event tags go with their events.", "as SqlEventLogStorage"),
    "ConcurrencySlotsTable": Reason(
        "Runs holding pool slots are freed through Dagster.", "as SqlEventLogStorage"
    ),
    "PendingStepsTable": Reason("As ConcurrencySlotsTable.", "as SqlEventLogStorage"),
    "DynamicPartitionsTable": Reason(
        "A pruned batch's dynamic partition goes in one statement per chunk.",
        "instance.delete_dynamic_partition, one key at a time",
    ),
    "RunsTable": Reason("A chunk's runs go in one statement.", "instance.delete_run"),
    "RunTagsTable": Reason("A chunk's run tags go with their runs.", "instance.delete_run"),
    # --- capturing a step's output without helper processes (kit/compute_logs.py) ----------------
    "LocalComputeLogManager": Reason(
        "kit/compute_logs.py stores step output exactly where and how Dagster's default does, "
        "so the UI reads it unchanged; only the capture differs.",
        "none: the class is configurable in dagster.yaml but not exported",
    ),
    "CapturedLogContext": Reason("What a compute log manager's capture yields.", "none"),
    "ComputeIOType": Reason("Names the stdout and stderr streams.", "none"),
    "IO_TYPE_EXTENSION": Reason("The file suffix of each stream, as the UI reads it.", "none"),
    "redirect_to_file": Reason(
        "Points the process's stdout or stderr file descriptor at the capture file (what the "
        "default does after starting its tail processes).",
        "none",
    ),
    "compute_logs_directory": Reason(
        "Where the default manager keeps a home's step output when no base_dir is configured.", "none"
    ),
    # --- Dagster's run tags we write or must not inherit (ops/), spelled out there ----------------
    "PARENT_RUN_ID_TAG": Reason(
        "The UI groups a re-execution with its parent by it (ops/reexecution.py spells it out).",
        "none",
    ),
    "ROOT_RUN_ID_TAG": Reason("As PARENT_RUN_ID_TAG, for the lineage's first run.", "none"),
    "RESUME_RETRY_TAG": Reason("Marks a re-execution from failure, as the UI's does.", "none"),
    "MAX_RETRIES_TAG": Reason("ops/runner.py turns Dagster's run retries off for our runs.", "none"),
    "AUTO_RETRY_RUN_ID_TAG": Reason(
        "Set on a lost run, it stops Dagster's run-retry daemon adding its own re-execution.",
        "none",
    ),
    "WILL_RETRY_TAG": Reason("Dagster's retry bookkeeping, not inherited by a re-execution.", "none"),
    "RETRY_NUMBER_TAG": Reason("As WILL_RETRY_TAG.", "none"),
    "RUN_FAILURE_REASON_TAG": Reason("As WILL_RETRY_TAG.", "none"),
}

__all__ = [
    "AUTO_RETRY_RUN_ID_TAG",
    "INDEX_SHARD_NAME",
    "INSTALLED_DAGSTER_VERSION",
    "IO_TYPE_EXTENSION",
    "KEPT_SHARD_ENGINES",
    "MAX_RETRIES_TAG",
    "PARENT_RUN_ID_TAG",
    "REASONS",
    "RESUME_RETRY_TAG",
    "RETRY_NUMBER_TAG",
    "ROOT_RUN_ID_TAG",
    "RUN_FAILURE_REASON_TAG",
    "SCHEMA_CHECKS",
    "SHARD_ATTRIBUTES",
    "SQLITE_BUSY_TIMEOUT_SECONDS",
    "VERIFIED_DAGSTER_VERSION",
    "WILL_RETRY_TAG",
    "ActiveExecution",
    "AssetEventTagsTable",
    "CapturedLogContext",
    "CheckRunHealthResult",
    "ComputeIOType",
    "ConcurrencySlotsTable",
    "DynamicPartitionsTable",
    "EngineEventData",
    "EventLogCursor",
    "ExecuteStepArgs",
    "ExecutionPlan",
    "InstanceConcurrencyContext",
    "KnownExecutionState",
    "LaunchRunContext",
    "LocalComputeLogManager",
    "PendingStepsTable",
    "PlanOrchestrationContext",
    "Reason",
    "ReconstructableJob",
    "RetryMode",
    "RunTagsTable",
    "RunsTable",
    "SerializableErrorInfo",
    "SqlEventLogStorage",
    "SqlEventLogStorageTable",
    "SqlRunStorage",
    "SqliteEventLogStorage",
    "SqliteRunStorage",
    "SqliteScheduleStorage",
    "UnresolvedAssetJobDefinition",
    "WorkerStatus",
    "check_shard_again",
    "compute_logs_directory",
    "create_execution_plan",
    "execute_plan_iterator",
    "get_retries_config",
    "is_verified_version",
    "keep_sqlite_engines",
    "pack_value",
    "redirect_to_file",
    "remember_config_schemas",
    "remember_schema_checks",
    "remember_true",
    "serializable_error_info_from_exc_info",
    "skip_shard_checks",
    "unpack_value",
]
