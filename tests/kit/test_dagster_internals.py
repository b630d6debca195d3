"""Contract tests for Dagster's private names (``kit/dagster_internals.py``).

Each name we import from ``dagster._`` is checked for what our code relies on: the parameters we
pass (by position or keyword), the attributes and methods we call, the columns we query. A Dagster
upgrade that moves or reshapes one fails here, naming it, instead of deep inside a crash test.
"""

from __future__ import annotations

import inspect
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from dagster import (
    AssetKey,
    AssetSelection,
    DagsterInstance,
    DefaultRunLauncher,
    Executor,
    asset,
    define_asset_job,
)

from durable_assets.kit import dagster_internals as di
from durable_assets.kit import tags
from durable_assets.ops import auto_resume
from tests.support.homes import shipped_home

#: What the module exports besides Dagster's names.
OWN = {
    "INSTALLED_DAGSTER_VERSION",
    "REASONS",
    "SCHEMA_CHECKS",
    "SHARD_ATTRIBUTES",
    "VERIFIED_DAGSTER_VERSION",
    "Reason",
    "check_shard_again",
    "is_verified_version",
    "keep_sqlite_engines",
    "KEPT_SHARD_ENGINES",
    "remember_config_schemas",
    "remember_schema_checks",
    "remember_true",
    "skip_shard_checks",
}


def test_every_private_name_says_why_and_what_would_replace_it() -> None:
    assert set(di.__all__) - OWN == set(di.REASONS)
    for name, reason in di.REASONS.items():
        assert getattr(di, name) is not None, name
        assert reason.why.strip() and reason.public.strip(), name


def test_the_installed_dagster_is_the_verified_one() -> None:
    assert di.is_verified_version(), (
        f"Dagster {di.INSTALLED_DAGSTER_VERSION} is installed but kit/dagster_internals.py was verified "
        f"with {di.VERIFIED_DAGSTER_VERSION}: read the other failures in this file against the new "
        "release (and retention's bulk delete against its storage schema), then bump "
        "VERIFIED_DAGSTER_VERSION"
    )


def test_only_the_adapter_imports_dagsters_private_modules() -> None:
    package = Path(di.__file__).parent.parent
    importers = sorted(
        str(path.relative_to(package.parent))
        for path in package.rglob("*.py")
        if "dagster._" in path.read_text() and path != Path(di.__file__)
    )
    assert importers == []


# --- signatures: the parameters we pass ----------------------------------------------------------

#: callable -> (leading positional parameter names we rely on, keyword names we pass)
CALLED: dict[str, tuple[Callable[..., Any], tuple[str, ...], set[str]]] = {
    "create_execution_plan": (
        di.create_execution_plan,
        ("job", "run_config"),
        {"step_keys_to_execute", "known_state", "tags"},
    ),
    "execute_plan_iterator": (
        di.execute_plan_iterator,
        (),
        {"execution_plan", "job", "dagster_run", "instance", "retry_mode", "run_config"},
    ),
    "EngineEventData": (di.EngineEventData, ("metadata",), {"metadata"}),
    "ExecuteStepArgs": (
        di.ExecuteStepArgs,
        (),
        {
            "job_origin",
            "run_id",
            "step_keys_to_execute",
            "instance_ref",
            "retry_mode",
            "known_state",
            "print_serialized_events",
        },
    ),
    "ExecutionPlan.start": (
        di.ExecutionPlan.start,
        ("self",),
        {"retry_mode", "instance_concurrency_context"},
    ),
    "InstanceConcurrencyContext": (di.InstanceConcurrencyContext, ("instance", "dagster_run"), set()),
    "KnownExecutionState.build_resume_retry_reexecution": (
        di.KnownExecutionState.build_resume_retry_reexecution,
        ("instance",),
        {"parent_run"},
    ),
    "RetryMode.from_config": (di.RetryMode.from_config, ("config_value",), set()),
    "SerializableErrorInfo": (di.SerializableErrorInfo, ("message", "stack", "cls_name"), set()),
    "serializable_error_info_from_exc_info": (di.serializable_error_info_from_exc_info, ("exc_info",), set()),
    "EventLogCursor.from_storage_id": (di.EventLogCursor.from_storage_id, ("storage_id",), set()),
    "ReconstructableJob.from_dict": (di.ReconstructableJob.from_dict, ("val",), set()),
    "CheckRunHealthResult": (di.CheckRunHealthResult, ("status", "msg"), set()),
    "LaunchRunContext": (di.LaunchRunContext, ("dagster_run",), set()),
    "pack_value": (di.pack_value, ("val",), set()),
    "unpack_value": (di.unpack_value, ("val",), {"as_type"}),
    "Executor.log_failure_or_retry_event_after_error": (
        Executor.log_failure_or_retry_event_after_error,
        ("self", "step_context", "err_info", "known_state"),
        set(),
    ),
    "SqlEventLogStorage.delete_events": (di.SqlEventLogStorage.delete_events, ("self", "run_id"), set()),
    "SqlEventLogStorage.free_concurrency_slots_for_run": (
        di.SqlEventLogStorage.free_concurrency_slots_for_run,
        ("self", "run_id"),
        set(),
    ),
}


@pytest.mark.parametrize("name", sorted(CALLED))
def test_the_parameters_we_pass_are_still_there(name: str) -> None:
    fn, positional, keywords = CALLED[name]
    params = inspect.signature(fn).parameters
    assert tuple(params)[: len(positional)] == positional, f"{name}{inspect.signature(fn)}"
    assert keywords <= set(params), f"{name} lost {sorted(keywords - set(params))}"


# --- attributes: the methods and members we use ---------------------------------------------------

USED: dict[str, tuple[Any, set[str]]] = {
    "ActiveExecution": (
        di.ActiveExecution,
        {
            "is_complete",
            "check_for_interrupts",
            "mark_interrupted",
            "handle_event",
            "verify_complete",
            "plan_events_iterator",
            "get_steps_to_execute",
            "get_known_state",
            "get_step_by_key",
        },
    ),
    "PlanOrchestrationContext": (
        di.PlanOrchestrationContext,
        {"instance", "dagster_run", "reconstructable_job", "log", "for_step"},
    ),
    "ReconstructableJob": (di.ReconstructableJob, {"from_dict", "to_dict", "get_python_origin"}),
    "RetryMode": (di.RetryMode, {"ENABLED", "from_config", "for_inner_plan"}),
    "WorkerStatus": (di.WorkerStatus, {"RUNNING", "FAILED"}),
    "CheckRunHealthResult": (di.CheckRunHealthResult, {"status", "msg"}),
    "SerializableErrorInfo": (di.SerializableErrorInfo, {"to_string"}),
    "EventLogCursor": (di.EventLogCursor, {"from_storage_id", "to_string", "parse"}),
    "SqlEventLogStorage": (
        di.SqlEventLogStorage,
        {"index_connection", "is_run_sharded", "supports_global_concurrency_limits"},
    ),
    "SqlRunStorage": (di.SqlRunStorage, {"connect", "delete_run"}),
    # keep_sqlite_engines: the method it replaces and what its replacement calls as Dagster's did
    "SqliteEventLogStorage": (di.SqliteEventLogStorage, {"_connect", "_initdb", "conn_string_for_shard"}),
    "SqliteRunStorage": (di.SqliteRunStorage, {"connect"}),
    "SqliteScheduleStorage": (di.SqliteScheduleStorage, {"connect"}),
    "DefaultRunLauncher": (
        DefaultRunLauncher,
        {"_instance"},
    ),  # kit/launcher.py reads the launcher's instance
}


@pytest.mark.parametrize("name", sorted(USED))
def test_the_members_we_use_are_still_there(name: str) -> None:
    cls, members = USED[name]
    missing = sorted(m for m in members if not hasattr(cls, m))
    assert missing == [], f"{name} lost {missing}"


def test_execution_plan_start_still_yields_an_active_execution() -> None:
    assert inspect.signature(di.ExecutionPlan.start).return_annotation in (
        "ActiveExecution",
        di.ActiveExecution,
    )


#: table -> the columns retention's bulk path reads or filters on
COLUMNS = {
    "SqlEventLogStorageTable": {"id", "event", "run_id", "dagster_event_type"},
    "AssetEventTagsTable": {"event_id"},
    "ConcurrencySlotsTable": {"run_id"},
    "PendingStepsTable": {"run_id"},
    "DynamicPartitionsTable": {"partitions_def_name", "partition"},
    "RunsTable": {"run_id"},
    "RunTagsTable": {"run_id"},
}


@pytest.mark.parametrize("table", sorted(COLUMNS))
def test_the_columns_retention_uses_are_still_there(table: str) -> None:
    columns = set(getattr(di, table).c.keys())
    assert COLUMNS[table] <= columns, f"{table} lost {sorted(COLUMNS[table] - columns)}"


# --- behaviour we rely on, exercised cheaply ------------------------------------------------------


def test_the_sqlite_instance_is_sql_storage_with_the_shard_layout_retention_reads(tmp_path: Path) -> None:
    with DagsterInstance.local_temp(str(tmp_path)) as instance:
        events, runs = instance.event_log_storage, instance.run_storage
        assert isinstance(events, di.SqlEventLogStorage) and isinstance(runs, di.SqlRunStorage)
        assert events.is_run_sharded
        shard = events.path_for_shard("some-run")  # type: ignore[attr-defined]
        assert Path(shard).parent.is_relative_to(tmp_path) and shard.endswith("some-run.db")
        assert isinstance(events._initialized_dbs, set)  # type: ignore[attr-defined]
        assert instance.run_launcher._instance is instance  # type: ignore[attr-defined]


def test_define_asset_job_still_returns_the_type_we_annotate() -> None:
    @asset
    def a() -> None: ...

    assert isinstance(
        define_asset_job("j", selection=AssetSelection.assets(a)), di.UnresolvedAssetJobDefinition
    )


def test_retries_config_cursor_and_error_info_round_trip() -> None:
    assert "enabled" in di.get_retries_config().config_type.fields  # type: ignore[attr-defined]
    assert di.RetryMode.from_config({"enabled": {}}) == di.RetryMode.ENABLED
    assert di.EventLogCursor.parse(di.EventLogCursor.from_storage_id(42).to_string()).storage_id() == 42
    try:
        raise ValueError("boom")
    except ValueError:
        info = di.serializable_error_info_from_exc_info(sys.exc_info())
    assert info.cls_name == "ValueError" and "boom" in info.to_string()
    packed = di.pack_value(di.SerializableErrorInfo("lost", [], "StepTaskLostError"))
    assert di.unpack_value(packed, as_type=di.SerializableErrorInfo).cls_name == "StepTaskLostError"


def test_the_tags_we_spell_out_are_dagsters() -> None:
    assert tags.PARENT_RUN_ID_TAG == di.PARENT_RUN_ID_TAG
    assert tags.ROOT_RUN_ID_TAG == di.ROOT_RUN_ID_TAG
    assert tags.RESUME_RETRY_TAG == di.RESUME_RETRY_TAG
    assert tags.MAX_RETRIES_TAG == di.MAX_RETRIES_TAG
    assert tags.AUTO_RETRY_RUN_ID_TAG == di.AUTO_RETRY_RUN_ID_TAG
    retry_bookkeeping = (di.WILL_RETRY_TAG, di.RETRY_NUMBER_TAG, di.RUN_FAILURE_REASON_TAG)
    assert retry_bookkeeping == (tags.WILL_RETRY_TAG, tags.RETRY_NUMBER_TAG, tags.FAILURE_REASON_TAG)
    assert retry_bookkeeping == auto_resume._NOT_INHERITED_PREFIXES
    assert di.RESUME_RETRY_TAG in auto_resume._NOT_INHERITED


# --- the schema checks a long-lived process remembers (remember_schema_checks) ------------------

#: storage attribute -> the SQL storage class whose methods SCHEMA_CHECKS names, and their parameters
SCHEMA_CHECK_PARAMS: dict[str, tuple[type, dict[str, tuple[str, ...]]]] = {
    "event_log_storage": (
        di.SqlEventLogStorage,
        {"has_table": ("self", "table_name"), "has_asset_key_col": ("self", "column_name")},
    ),
    "run_storage": (di.SqlRunStorage, {"has_run_stats_index_cols": ("self",)}),
}


@pytest.mark.parametrize("storage", sorted(di.SCHEMA_CHECKS))
def test_the_schema_checks_we_remember_are_still_there(storage: str) -> None:
    cls, params = SCHEMA_CHECK_PARAMS[storage]
    assert set(di.SCHEMA_CHECKS[storage]) == set(params)
    for name, expected in params.items():
        assert tuple(inspect.signature(getattr(cls, name)).parameters) == expected, f"{cls.__name__}.{name}"


def _watching_statements(work: Callable[[], Any], record: Callable[..., None]) -> None:
    """``work``, with ``record(conn, cursor, statement, ...)`` called before each of its statements on
    any engine."""
    sa.event.listen(sa.engine.Engine, "before_cursor_execute", record)
    try:
        work()
    finally:
        sa.event.remove(sa.engine.Engine, "before_cursor_execute", record)


def _statements(reads: Callable[[], None]) -> list[str]:
    """The SQL statements ``reads`` sends, through any engine."""
    seen: list[str] = []
    _watching_statements(reads, lambda _conn, _cursor, statement, *_args: seen.append(statement))
    return seen


def _catalog_queries(reads: Callable[[], None]) -> int:
    """Statements ``reads`` sends to Postgres's catalog (what SQLAlchemy's reflection asks)."""
    return sum("pg_catalog" in s or "information_schema" in s for s in _statements(reads))


@pytest.mark.postgres
def test_a_remembered_instance_stops_asking_the_catalog(
    tmp_path: Path, pg_database: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The reads a worker task makes ask the catalog each time; remembered, never again. If a Dagster
    release moves a check out of the methods we wrap, the first assertion still holds and the second
    fails: the wrapping no longer saves anything."""
    monkeypatch.setenv("DAGSTER_PG_URL", pg_database)
    instance = DagsterInstance.from_config(str(shipped_home(tmp_path, "distributed")))
    try:

        def reads() -> None:
            instance.get_run_by_id("no-such-run")
            instance.get_asset_records([AssetKey("invoices")])
            instance.has_dynamic_partition("batches", "b-1")

        reads()  # storages created, connections opened
        assert _catalog_queries(reads) > 0
        di.remember_schema_checks(instance)
        di.remember_schema_checks(instance)  # idempotent: one wrapper, not two
        reads()  # the first answers, remembered
        assert _catalog_queries(reads) == 0
    finally:
        instance.dispose()


@pytest.mark.postgres
def test_a_workers_instance_remembers_that_a_batch_partition_exists(
    tmp_path: Path, pg_database: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Dagster asks by keyword, several times per step; a missing partition is asked again."""
    from durable_assets.kit.step_task import _for_tasks

    monkeypatch.setenv("DAGSTER_PG_URL", pg_database)
    instance = _for_tasks(DagsterInstance.from_config(str(shipped_home(tmp_path, "distributed"))))
    try:
        assert not instance.has_dynamic_partition(partitions_def_name="batches", partition_key="b-1")
        instance.add_dynamic_partitions("batches", ["b-1"])
        assert instance.has_dynamic_partition(partitions_def_name="batches", partition_key="b-1")

        def asks() -> None:
            assert instance.has_dynamic_partition(partitions_def_name="batches", partition_key="b-1")

        assert _statements(asks) == []
    finally:
        instance.dispose()


def test_only_true_answers_are_remembered_and_the_oldest_goes_first() -> None:
    asked: list[str] = []
    exists = {"a", "b", "c"}

    def has(key: str) -> bool:
        asked.append(key)
        return key in exists

    remembered = di.remember_true(has, max_entries=2)
    assert [remembered(k) for k in ("a", "a", "x", "x")] == [True, True, False, False]
    assert asked == ["a", "x", "x"]  # a False answer is asked again (a migration may have run since)
    assert remembered(key="b") and remembered(key="b")  # by keyword, as Dagster asks
    assert asked == ["a", "x", "x", "b"]
    assert remembered("c")  # a third answer: "a", the oldest, is forgotten
    asked.clear()
    assert remembered("c") and remembered(key="b") and remembered("a")
    assert asked == ["a"]


# --- reading a run's SQLite shard without its schema check (skip_shard_checks) -----------------


def _one_op_job() -> Any:
    from dagster import job, op

    @op
    def nothing() -> None:
        pass

    @job
    def one_op() -> None:
        nothing()

    return one_op


def test_a_written_shard_is_read_without_its_schema_check(tmp_path: Path) -> None:
    """SQLite's event log keeps the shards it checked in ``_initialized_dbs`` and finds a run's
    file by ``path_for_shard``: marked, a written shard is read as before; an unwritten one is left
    to Dagster; ``check_shard_again`` unmarks one."""
    with DagsterInstance.from_config(str(shipped_home(tmp_path))) as instance:
        storage = instance.event_log_storage
        assert all(hasattr(storage, name) for name in di.SHARD_ATTRIBUTES)
        run = instance.create_run_for_job(job_def=_one_op_job())
        instance.report_run_failed(run, message="written")
    with DagsterInstance.from_config(str(shipped_home(tmp_path))) as reader:
        assert di.skip_shard_checks(reader, [run.run_id, "no-such-run"]) == {run.run_id}
        assert [e.message for e in reader.all_logs(run.run_id)][-1] == "written"
        di.check_shard_again(reader, run.run_id)
        assert run.run_id not in reader.event_log_storage._initialized_dbs  # type: ignore[attr-defined]


# --- a SQLite file's engine built once per process (keep_sqlite_engines) ------------------------


def _engines_used(work: Callable[[], Any]) -> set[Any]:
    """The SQLAlchemy engines ``work``'s statements ran on (kept alive, so none is counted twice)."""
    seen: set[Any] = set()
    _watching_statements(work, lambda conn, *_args: seen.add(conn.engine))
    return seen


def test_a_kept_instance_builds_each_sqlite_files_engine_once_and_writes_what_dagster_reads(
    tmp_path: Path,
) -> None:
    """Dagster builds an engine per statement (if a release stops doing so, the first assertion
    fails: the wrapping saves nothing); kept, one per file. What is written is read by an instance
    that keeps nothing, as before."""
    job_def = _one_op_job()
    with DagsterInstance.from_config(str(shipped_home(tmp_path))) as instance:

        def a_run() -> str:
            run = instance.create_run_for_job(job_def=job_def)
            for i in range(5):
                instance.report_engine_event(f"event {i}", run)
            instance.report_run_failed(run, message="written")
            assert instance.get_run_by_id(run.run_id) is not None
            return run.run_id

        assert len(_engines_used(a_run)) > 10
        assert all(hasattr(instance.event_log_storage, name) for name in ("_db_lock", "_initialized_dbs"))
        di.keep_sqlite_engines(instance)
        di.keep_sqlite_engines(instance)  # idempotent: one wrapper, not two
        run_ids: list[str] = []
        # the run storage's, the index shard's and the new run's shard (the schedule storage's unused)
        assert len(_engines_used(lambda: run_ids.append(a_run()))) == 3
    with DagsterInstance.from_config(str(shipped_home(tmp_path))) as reader:
        messages = [e.message for e in reader.all_logs(run_ids[0])]
        assert messages[-6:-1] == [f"event {i}" for i in range(5)] and messages[-1] == "written"


def test_a_kept_event_log_keeps_the_engines_of_its_most_recent_runs_only(tmp_path: Path) -> None:
    with DagsterInstance.from_config(str(shipped_home(tmp_path))) as instance:
        di.keep_sqlite_engines(instance)
        runs = [instance.create_run_for_job(job_def=_one_op_job()) for _ in range(di.KEPT_SHARD_ENGINES + 1)]

        def write(run: Any) -> Callable[[], None]:
            return lambda: instance.report_engine_event("again", run)

        first = _engines_used(write(runs[0]))
        for run in runs[1:]:
            write(run)()  # the first run's engine is the oldest, then dropped
        assert _engines_used(write(runs[-1])) == _engines_used(write(runs[-1]))  # kept
        assert _engines_used(write(runs[0])).isdisjoint(first)  # built again


# --- resource config schemas a long-lived process infers once (remember_config_schemas) ---------


def test_the_config_schema_inference_we_wrap_is_still_there() -> None:
    from dagster._config.pythonic_config import resource as pythonic_resource

    curry = pythonic_resource._curry_config_schema
    assert tuple(inspect.signature(curry).parameters) == ("schema_field", "data")
    infer = pythonic_resource.infer_schema_from_config_class
    assert tuple(inspect.signature(infer).parameters) == (
        "model_cls",
        "description",
        "fields_to_omit",
        "default",
    )


def test_a_resource_class_s_schema_is_inferred_once_and_its_values_still_resolve(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A worker builds each resource anew per step; the schema is the class's, so it is inferred
    once. The values each construction is given still resolve (and are still checked) per object."""
    from dagster import ConfigurableResource
    from dagster._config.pythonic_config import resource as pythonic_resource

    inferred: list[type] = []
    original = pythonic_resource.infer_schema_from_config_class

    def counted(model_cls: type, *args: Any, **kwargs: Any) -> Any:
        inferred.append(model_cls)
        return original(model_cls, *args, **kwargs)

    curried: list[Any] = []
    original_curry = pythonic_resource._curry_config_schema

    def counted_curry(schema_field: Any, data: Any) -> Any:
        curried.append(data)
        return original_curry(schema_field, data)

    # restored after the test: the attributes, and the flag that says they are wrapped
    monkeypatch.setattr(pythonic_resource, "infer_schema_from_config_class", counted)
    monkeypatch.setattr(pythonic_resource, "_curry_config_schema", counted_curry)
    monkeypatch.setattr(pythonic_resource, di._SCHEMAS_REMEMBERED, False, raising=False)
    di.remember_config_schemas()
    di.remember_config_schemas()  # idempotent: one wrapper, not two

    class Client(ConfigurableResource):  # type: ignore[type-arg]
        url: str
        retries: int = 3

    first = Client(url="http://a")
    second = first._with_updated_values({"retries": 5})
    assert inferred == [Client]
    assert second.retries == 5 and second.url == "http://a" and first.retries == 3
    assert first._schema is second._schema
    assert second._state__internal__.resolved_config_dict == {"url": "http://a", "retries": 5}
    again = Client(url="http://a", retries=5)  # the same values: applied to the schema once
    assert again._config_schema is second._config_schema
    assert curried == [{"url": "http://a"}, {"url": "http://a", "retries": 5}]
    assert Client(url="http://a", retries=6)._config_schema is not second._config_schema
    with pytest.raises(Exception, match="retries"):
        Client(url="http://a", retries="many")  # type: ignore[arg-type]


def test_only_plain_config_values_are_kept_and_their_types_count() -> None:
    frozen = di._frozen_config
    assert frozen({"a": 1}) != frozen({"a": True}) != frozen({"a": "1"})
    assert frozen({"a": [1, {"b": None}]}) == frozen({"a": [1, {"b": None}]})
    assert frozen({"a": object()}) is None and frozen({1: "x"}) is None and frozen((1, 2)) is None
