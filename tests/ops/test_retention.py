"""Retention: batches of known ages are pruned exactly as the policy says, archives are complete,
and a prune killed at any point is finished by the next one without losing or doubling anything.

Runs are real Dagster runs with real events, created through the instance API; their end times are
set with SQL on run storage's own ``runs`` table (no sleeping). Both storage backends.
"""

from __future__ import annotations

import fcntl
import gzip
import json
import os
import shutil
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import sqlalchemy as sa
from dagster import (
    AssetMaterialization,
    DagsterEvent,
    DagsterInstance,
    DagsterRun,
    DagsterRunStatus,
    RunsFilter,
)
from dagster._core.events import StepMaterializationData
from dagster._core.events.log import EventLogEntry
from dagster._core.storage.event_log.schema import AssetEventTagsTable, SqlEventLogStorageTable
from dagster._core.storage.runs.schema import RunsTable
from dagster._core.utils import make_new_run_id
from dagster_shared.serdes import deserialize_value

from durable_assets.errors import PruneInProgressError, UsageError
from durable_assets.kit import db as kit_db
from durable_assets.kit.cancel import CancelStore
from durable_assets.kit.db import DurableDatabase, now
from durable_assets.kit.leases import LeaseStore
from durable_assets.kit.progress import Progress, ProgressStore
from durable_assets.kit.tags import BATCH_TAG
from durable_assets.ops.retention import policy_from_env, prune_batches, pruning
from durable_assets.ops.retention.pruning import DAY_S, RetentionPolicy, read_archive
from tests.conftest import REPO, job_cli
from tests.support.machine import scaled

PARTITIONS = "batches"
_END_EVENT = {
    "success": "PIPELINE_SUCCESS",
    "failure": "PIPELINE_FAILURE",
    "canceled": "PIPELINE_CANCELED",
}


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def instance(
    request: pytest.FixtureRequest, dagster_home: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[DagsterInstance]:
    if request.param == "postgres":
        monkeypatch.setenv("DAGSTER_PG_URL", request.getfixturevalue("pg_database"))
        shutil.copy(REPO / "dagster_home" / "postgres" / "dagster.yaml", dagster_home / "dagster.yaml")
    with DagsterInstance.get() as inst:
        yield inst


# --- building a store with batches of known ages -------------------------------------------------


def _add_run(instance: DagsterInstance, batch_id: str, outcome: str | None, ended_days_ago: float) -> str:
    """One run with a few real events; outcome None = still running; "canceling"; "not_started"."""
    run = DagsterRun(
        job_name="refund_batch",
        run_id=make_new_run_id(),
        tags={BATCH_TAG: batch_id, "dagster/partition": batch_id},
        status=DagsterRunStatus.NOT_STARTED,
    )
    instance.add_run(run)
    if outcome == "not_started":
        return run.run_id

    def event(kind: str, data: object = None) -> None:
        dagster_event = DagsterEvent(
            event_type_value=kind, job_name=run.job_name, message=kind, event_specific_data=data
        )
        instance.report_dagster_event(dagster_event, run_id=run.run_id)

    event("PIPELINE_START")
    instance.report_engine_event("working", run)
    mat = AssetMaterialization(asset_key="refunds", partition=batch_id, tags={"batch": batch_id})
    event("ASSET_MATERIALIZATION", StepMaterializationData(mat))
    if outcome == "canceling":
        instance.report_run_canceling(run, message="cancel requested")
    elif outcome is not None:
        event(_END_EVENT[outcome])
        ended = now() - ended_days_ago * DAY_S
        with instance.run_storage.connect() as conn:  # type: ignore[attr-defined]
            conn.execute(RunsTable.update().where(RunsTable.c.run_id == run.run_id).values(end_time=ended))
    return run.run_id


def add_batch(instance: DagsterInstance, batch_id: str, *runs: tuple[str | None, float]) -> list[str]:
    """A lineage (oldest run first), its dynamic partition and a row in each of our batch tables."""
    instance.add_dynamic_partitions(PARTITIONS, [batch_id])
    run_ids = [_add_run(instance, batch_id, outcome, days) for outcome, days in runs]
    db = DurableDatabase.for_instance(instance)
    leases = LeaseStore(db, ttl_s=15)
    leases.release(leases.acquire(batch_id, run_ids[-1], owner="worker-that-finished"))
    ProgressStore(db).write(batch_id, run_ids[-1], Progress(7, 7, "done", 1, 1))
    CancelStore(db).request(batch_id)
    return run_ids


@dataclass
class Snapshot:
    """What storage holds for one batch, as the assertions need it."""

    run_ids: list[str]
    events: dict[str, list[int]]


def run_ids_of(instance: DagsterInstance, batch_id: str) -> list[str]:
    records = instance.get_run_records(RunsFilter(tags={BATCH_TAG: batch_id}))
    return [r.dagster_run.run_id for r in sorted(records, key=lambda r: r.storage_id)]


def snapshot(instance: DagsterInstance, batch_id: str) -> Snapshot:
    run_ids = run_ids_of(instance, batch_id)
    events = {
        rid: [rec.storage_id for rec in instance.get_records_for_run(rid, limit=100_000).records]
        for rid in run_ids
    }
    return Snapshot(run_ids, events)


def own_rows(instance: DagsterInstance, batch_id: str) -> int:
    db = DurableDatabase.for_instance(instance)
    with db.engine.connect() as conn:
        return sum(
            conn.execute(sa.select(sa.func.count()).where(t.c.batch_id == batch_id)).scalar_one()
            for t in kit_db.metadata.sorted_tables
            if "batch_id" in t.c
        )


def leftover_event_rows(instance: DagsterInstance, run_ids: list[str], shard_files: bool = True) -> int:
    """Event rows of these runs anywhere in the index (SQLite) or the single event table (Postgres),
    plus asset event tags whose event is gone, plus per-run SQLite shard files (which only the
    bulk delete removes: Dagster's own leaves them, emptied) and the rows they still hold."""
    storage = instance.event_log_storage
    with storage.index_connection() as conn:  # type: ignore[attr-defined]
        rows = conn.execute(
            sa.select(sa.func.count()).where(SqlEventLogStorageTable.c.run_id.in_(run_ids))
        ).scalar_one()
        orphans = conn.execute(
            sa.select(sa.func.count()).where(
                AssetEventTagsTable.c.event_id.not_in(sa.select(SqlEventLogStorageTable.c.id))
            )
        ).scalar_one()
    shards = 0
    if storage.is_run_sharded:
        paths = [Path(storage.path_for_shard(rid)) for rid in run_ids]  # type: ignore[attr-defined]
        shards = sum(p.exists() for p in paths) if shard_files else 0
        shards += sum(_rows_in_shard(p) for p in paths if p.exists())
    return int(rows) + int(orphans) + shards


def _rows_in_shard(path: Path) -> int:
    engine = sa.create_engine(f"sqlite:///{path}", poolclass=sa.pool.NullPool)
    try:
        with engine.connect() as conn:
            count = sa.select(sa.func.count()).select_from(SqlEventLogStorageTable)
            return int(conn.execute(count).scalar_one())
    finally:
        engine.dispose()


def archives(archive_dir: Path, batch_id: str) -> list[Path]:
    return sorted(archive_dir.glob(f"{batch_id}--*.jsonl.gz"))


def assert_archive_complete(path: Path, before: Snapshot, batch_id: str) -> None:
    """The file holds every run and every event record storage held, deserializable by Dagster."""
    records = list(read_archive(path))
    kinds = [r["kind"] for r in records]
    assert kinds[0] == "batch" and kinds[-1] == "end" and kinds.count("status") == 1
    assert records[0]["batch_id"] == batch_id and records[0]["run_ids"] == before.run_ids
    runs = [deserialize_value(r["dagster_run"], DagsterRun) for r in records if r["kind"] == "run"]
    assert [r.run_id for r in runs] == before.run_ids
    archived: dict[str, list[int]] = {rid: [] for rid in before.run_ids}
    for r in records:
        if r["kind"] == "event":
            entry = deserialize_value(r["event"], EventLogEntry)
            assert entry.run_id == r["run_id"]
            archived[r["run_id"]].append(r["storage_id"])
    assert archived == before.events
    assert records[-1]["events"] == sum(len(v) for v in before.events.values())
    status = next(r["status"] for r in records if r["kind"] == "status")
    assert status["id"] == batch_id and status["run_ids"] == before.run_ids


# --- the policy ----------------------------------------------------------------------------------

#: batch -> (runs oldest first as (outcome, days since it ended), pruned under 30/90 days?)
AGES: dict[str, tuple[list[tuple[str | None, float]], bool]] = {
    "ok-31d": ([("success", 31)], True),
    "ok-29d": ([("success", 29)], False),
    "failed-89d": ([("failure", 89)], False),
    "failed-91d": ([("failure", 91)], True),
    "canceled-91d": ([("canceled", 91)], True),
    "canceled-89d": ([("canceled", 89)], False),
    # age is the newest run's end; the lineage goes (or stays) as a whole
    "retried-ok-31d": ([("failure", 200), ("success", 31)], True),
    "retried-ok-10d": ([("failure", 200), ("success", 10)], False),
    "running": ([("failure", 200), (None, 0)], False),
    "canceling": ([("canceled", 300), ("canceling", 0)], False),
    "not-started": ([("failure", 300), ("not_started", 0)], False),
}


@pytest.mark.parametrize("bulk", [True, False], ids=["bulk", "public-api"])
def test_prunes_exactly_per_policy_and_archives_everything(
    instance: DagsterInstance,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    bulk: bool,
) -> None:
    """The same outcome on the verified Dagster release (bulk SQL on Dagster's tables) and on any
    other (the public API, run by run), but for the emptied SQLite shard files Dagster leaves."""
    monkeypatch.setattr(pruning, "EVENT_PAGE", 2)  # every run's events span several pages
    if not bulk:
        monkeypatch.setattr(pruning, "is_verified_version", lambda: False)  # the name pruning reads
    for batch_id, (runs, _) in AGES.items():
        add_batch(instance, batch_id, *runs)
    untagged = DagsterRun(job_name="other", run_id=make_new_run_id(), status=DagsterRunStatus.SUCCESS)
    instance.add_run(untagged)  # not a batch: never ours to prune
    before = {b: snapshot(instance, b) for b in AGES}
    gone = {b for b, (_, pruned) in AGES.items() if pruned}
    archive_dir = tmp_path / "archive"
    policy = RetentionPolicy(completed_days=30, failed_days=90)

    dry = prune_batches(instance, policy=policy, archive_dir=str(archive_dir), dry_run=True).as_dict()
    assert {b["id"] for b in dry["batches"]} == gone
    assert sorted(dry["in_progress"]) == ["canceling", "not-started", "running"]
    assert {b: snapshot(instance, b) for b in AGES} == before  # dry run changed nothing
    assert not archive_dir.exists()

    report = prune_batches(instance, policy=policy, archive_dir=str(archive_dir)).as_dict()
    assert {b["id"] for b in report["batches"]} == gone and report["skipped"] == []
    assert report["runs_pruned"] == sum(len(before[b].run_ids) for b in gone)
    partitions = set(instance.get_dynamic_partitions(PARTITIONS))
    for batch_id in AGES:
        if batch_id in gone:
            assert snapshot(instance, batch_id).run_ids == []
            assert leftover_event_rows(instance, before[batch_id].run_ids, shard_files=bulk) == 0
            assert batch_id not in partitions and own_rows(instance, batch_id) == 0
            [path] = archives(archive_dir, batch_id)
            assert_archive_complete(path, before[batch_id], batch_id)
        else:
            assert snapshot(instance, batch_id) == before[batch_id]
            assert batch_id in partitions and own_rows(instance, batch_id) == 3
            assert archives(archive_dir, batch_id) == []
    assert instance.get_run_by_id(untagged.run_id) is not None

    again = prune_batches(instance, policy=policy, archive_dir=str(archive_dir)).as_dict()
    assert again["batches"] == [] and len(list(archive_dir.glob("*.gz"))) == len(gone)
    fell_back = [r for r in caplog.records if "public API" in r.getMessage()]
    assert len(fell_back) == (0 if bulk else 2)  # one warning per prune that deletes


def test_ledger_keys_outlive_batches_and_go_on_their_own_horizon(
    instance: DagsterInstance, tmp_path: Path
) -> None:
    db = DurableDatabase.for_instance(instance)
    t = now()

    def key(name: str, point: str, days: float) -> dict[str, object]:
        ts = t - days * DAY_S
        return {
            "account": "embedded:acct_retention:test",
            "scope": "refund",
            "key": name,
            "fingerprint": "f",
            "recovery_point": point,
            "params": "{}",
            "claim_fence": 0,
            "claim_expires_at": 0.0,
            "created_at": ts,
            "updated_at": ts,
        }

    with db.transaction() as conn:
        conn.execute(
            kit_db.idempotency.insert(),
            [
                key("old-finished", "finished", 400),
                key("old-review", "review", 400),
                key("old-unknown-outcome", "started", 400),  # intent without result: kept
                key("recent-finished", "finished", 100),  # older than its batch, younger than a year
            ],
        )
        conn.execute(
            kit_db.effect_subjects.insert(),
            [
                {
                    "account": "embedded:acct_retention:test",
                    "scope": "refund",
                    "subject": f"charge:{name}",
                    "key": name,
                    "created_at": t - 400 * DAY_S,
                }
                for name in ("old-finished", "old-unknown-outcome", "recent-finished")
            ],
        )
    add_batch(instance, "ok-31d", ("success", 31))
    report = prune_batches(instance, policy=RetentionPolicy(), archive_dir=str(tmp_path / "a")).as_dict()
    assert [b["id"] for b in report["batches"]] == ["ok-31d"] and report["ledger_keys_pruned"] == 2
    with db.engine.connect() as conn:
        left = set(conn.execute(sa.select(kit_db.idempotency.c.key)).scalars())
    assert left == {"old-unknown-outcome", "recent-finished"}
    with db.engine.connect() as conn:
        subjects = set(conn.execute(sa.select(kit_db.effect_subjects.c.key)).scalars())
    assert subjects == left  # a subject goes with the key that claimed it, never before


def test_batch_held_by_a_live_worker_is_left_alone(dagster_home: Path, tmp_path: Path) -> None:
    with DagsterInstance.get() as instance:
        run_ids = add_batch(instance, "resuming", ("failure", 100))
        LeaseStore(DurableDatabase.for_instance(instance), ttl_s=60).acquire("resuming", "new", owner="w2")
        before = snapshot(instance, "resuming")
        report = prune_batches(instance, archive_dir=str(tmp_path / "a")).as_dict()
        assert report["batches"] == [] and [s["id"] for s in report["skipped"]] == ["resuming"]
        assert "held by worker w2" in report["skipped"][0]["reason"]
        assert snapshot(instance, "resuming") == before and before.run_ids == run_ids
        assert archives(tmp_path / "a", "resuming") == []


def test_archive_that_disagrees_with_storage_skips_only_that_batch(
    dagster_home: Path, tmp_path: Path
) -> None:
    archive_dir = tmp_path / "a"
    archive_dir.mkdir()
    with DagsterInstance.get() as instance:
        for batch_id in ("a", "b", "c"):
            add_batch(instance, batch_id, ("success", 40))
        before = snapshot(instance, "b")
        stale = archive_dir / f"b--{before.run_ids[0]}.jsonl.gz"
        with gzip.open(stale, "wt") as f:  # a complete archive, but of other runs
            f.write(json.dumps({"kind": "batch", "batch_id": "b", "run_ids": ["someone-else"]}) + "\n")
            f.write(json.dumps({"kind": "end", "runs": 1, "events": 0}) + "\n")
        report = prune_batches(instance, archive_dir=str(archive_dir)).as_dict()
        assert sorted(b["id"] for b in report["batches"]) == ["a", "c"]
        assert [s["id"] for s in report["skipped"]] == ["b"] and "someone-else" in report["skipped"][0][
            "reason"
        ]
        assert snapshot(instance, "b") == before and own_rows(instance, "b") == 3
        lease = LeaseStore(DurableDatabase.for_instance(instance)).get("b")
        assert lease is not None and not lease.is_live()  # a resume of b is not blocked
        assert run_ids_of(instance, "a") == [] and run_ids_of(instance, "c") == []


def test_one_prune_at_a_time_and_policy_validation(dagster_home: Path, tmp_path: Path) -> None:
    archive_dir = tmp_path / "a"
    archive_dir.mkdir()
    with DagsterInstance.get() as instance:
        add_batch(instance, "ok-31d", ("success", 31))
        with open(archive_dir / ".prune.lock", "w") as held:
            fcntl.flock(held, fcntl.LOCK_EX)
            with pytest.raises(PruneInProgressError):
                prune_batches(instance, archive_dir=str(archive_dir))
        assert snapshot(instance, "ok-31d").run_ids
    with pytest.raises(UsageError):
        RetentionPolicy(completed_days=-1)
    os.environ["DURABLE_RETENTION_FAILED_DAYS"] = "soon"
    try:
        with pytest.raises(UsageError):
            policy_from_env()
    finally:
        del os.environ["DURABLE_RETENTION_FAILED_DAYS"]
    assert policy_from_env(completed_days=1).completed_days == 1


def test_dagster_retention_job_prunes_like_the_cli(dagster_home: Path, tmp_path: Path) -> None:
    from dagster import DefaultScheduleStatus

    from durable_assets.definitions import defs

    assert defs.resolve_schedule_def("retention_daily").default_status == DefaultScheduleStatus.RUNNING
    with DagsterInstance.get() as instance:
        add_batch(instance, "ok-31d", ("success", 31))
        add_batch(instance, "ok-29d", ("success", 29))
        result = defs.resolve_job_def("retention").execute_in_process(
            instance=instance,
            run_config={"ops": {"prune_old_batches": {"config": {"archive_dir": str(tmp_path / "a")}}}},
        )
        assert result.success
        assert snapshot(instance, "ok-31d").run_ids == [] and snapshot(instance, "ok-29d").run_ids
        assert len(archives(tmp_path / "a", "ok-31d")) == 1


# --- a real batch through the CLI ----------------------------------------------------------------


@pytest.mark.slow
def test_cli_prunes_a_real_batch(dagster_home: Path) -> None:
    assert job_cli("run", "--id", "real", "--size", "50").returncode == 0
    with DagsterInstance.get() as instance:
        before = snapshot(instance, "real")
    assert len(before.events[before.run_ids[0]]) > 50  # a real run: steps, outputs, materializations

    assert job_cli("prune", "--completed-days", "-1").returncode == 2
    kept = json.loads(job_cli("prune", "--json").stdout)  # default 30 days: a new batch stays
    assert kept["batches"] == [] and kept["runs_pruned"] == 0
    dry = job_cli("prune", "--dry-run", "--completed-days", "0")
    assert dry.returncode == 0 and "would prune 1 batches" in dry.stdout and "real" in dry.stdout

    done = job_cli("prune", "--completed-days", "0", "--json")
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout)
    [entry] = out["batches"]
    assert entry["id"] == "real" and entry["runs"] == 1 and out["runs_per_s"] > 0
    assert Path(entry["archive"]).parent == dagster_home / "archive"
    assert_archive_complete(Path(entry["archive"]), before, "real")
    assert job_cli("status", "--id", "real").returncode == 3  # gone from storage
    with DagsterInstance.get() as instance:
        assert leftover_event_rows(instance, before.run_ids) == 0
        assert "real" not in instance.get_dynamic_partitions(PARTITIONS)
        assert own_rows(instance, "real") == 0
        with DurableDatabase.for_instance(instance).engine.connect() as conn:  # keys outlive the batch
            assert conn.execute(sa.select(sa.func.count()).select_from(kit_db.idempotency)).scalar_one() > 0


# --- crashes -------------------------------------------------------------------------------------

_DRIVER = textwrap.dedent(
    """
    import os, signal, sys
    from dagster import DagsterInstance
    import durable_assets.ops.retention.pruning as pruning
    from durable_assets.ops.retention import prune_batches

    point, nth, pruning.CHUNK_SIZE = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    real, calls = getattr(pruning, point), [0]

    def crash(*args, **kwargs):
        calls[0] += 1
        if calls[0] >= nth:
            os.kill(os.getpid(), signal.SIGKILL)
        return real(*args, **kwargs)

    setattr(pruning, point, crash)
    with DagsterInstance.get() as instance:
        prune_batches(instance)
    sys.exit(7)  # the crash point was never reached
    """
)

CRASH_POINTS = {
    "archive-renaming": ("_publish", 2, 200),  # one archive published, the next only a temp file
    "archived-nothing-deleted": ("_delete_event_logs", 1, 200),
    "events-gone-runs-left": ("_delete_runs", 1, 200),
    "second-chunk": ("_delete_runs", 2, 1),  # first lineage fully pruned, second half way
}


@pytest.mark.slow
@pytest.mark.parametrize("point", list(CRASH_POINTS))
def test_crash_then_rerun_loses_nothing_and_archives_nothing_twice(
    instance: DagsterInstance, point: str, tmp_path: Path
) -> None:
    ages = {b: AGES[b] for b in ("ok-31d", "failed-91d", "retried-ok-31d", "ok-29d", "running")}
    for batch_id, (runs, _) in ages.items():
        add_batch(instance, batch_id, *runs)
    before = {b: snapshot(instance, b) for b in ages}
    gone = {b for b, (_, pruned) in ages.items() if pruned}
    archive_dir = Path(instance.root_directory) / "archive"
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    fn, nth, chunk = CRASH_POINTS[point]

    crashed = subprocess.run(
        [sys.executable, "-c", _DRIVER, fn, str(nth), str(chunk)],
        env=env,
        capture_output=True,
        text=True,
        timeout=scaled(240),
        check=False,
    )
    assert crashed.returncode == -9, crashed.stderr
    for batch_id in ages:  # right after the crash: each batch in storage, or archived (or both)
        stored = run_ids_of(instance, batch_id)  # (its events may be gone already: not read here)
        assert stored in ([], before[batch_id].run_ids)
        assert (
            len(archives(archive_dir, batch_id)) == 1
            if not stored
            else len(archives(archive_dir, batch_id)) <= 1
        )

    report = prune_batches(instance).as_dict()
    assert report["skipped"] == []
    for batch_id in ages:
        found = archives(archive_dir, batch_id)
        if batch_id in gone:
            assert run_ids_of(instance, batch_id) == [] and len(found) == 1
            assert_archive_complete(found[0], before[batch_id], batch_id)
            assert leftover_event_rows(instance, before[batch_id].run_ids) == 0
            assert own_rows(instance, batch_id) == 0
        else:
            assert snapshot(instance, batch_id) == before[batch_id] and found == []
    assert not list(archive_dir.glob(".*.tmp"))  # the interrupted temporary file was replaced
    assert {p.name for p in archive_dir.glob("*.gz")} == {
        f"{b}--{before[b].run_ids[0]}.jsonl.gz" for b in gone
    }
