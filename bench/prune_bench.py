"""Benchmark: pruning N runs with `job prune`'s code against Dagster's own delete_run, one by one.

    .venv/bin/python bench/prune_bench.py 5000                 # SQLite (the default instance)
    .venv/bin/python bench/prune_bench.py 5000 --postgres URL  # a Postgres server (scratch DBs)

Both sides get an identical store, built once and copied, in the same call: N runs in lineages
of two (a failed first run and its successful re-execution), three events each (run start, an
engine event, run end), the batch's dynamic partition and progress row, all ended 40 days ago.
Ours archives every lineage (runs, events, status JSON; fsynced) before deleting it; the baseline
deletes only. On SQLite the baseline also leaves every run's emptied shard file on disk.

Building the store is not measured and goes through the storages' own APIs (``add_run``, the event
log's ``prepare_insert_event_batch``) rather than executing jobs, which would take minutes.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Engine

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from dagster import DagsterEvent, DagsterInstance, DagsterRun, DagsterRunStatus, RunsFilter  # noqa: E402
from dagster._core.events.log import EventLogEntry  # noqa: E402
from dagster._core.instance.ref import InstanceRef  # noqa: E402
from dagster._core.storage.runs.schema import RunsTable  # noqa: E402
from dagster._core.utils import make_new_run_id  # noqa: E402

from durable_assets.kit import db as kit_db  # noqa: E402
from durable_assets.kit.tags import BATCH_TAG  # noqa: E402
from durable_assets.ops.retention import prune_batches  # noqa: E402
from durable_assets.ops.retention.pruning import DAY_S, RetentionPolicy  # noqa: E402

RUNS_PER_BATCH = 2
_CHUNK = 500


@contextlib.contextmanager
def _no_fsync_while_building() -> Iterator[None]:
    """Building the store is not what we measure: skip SQLite's fsyncs while it is written."""

    def connect(dbapi_conn: Any, _record: Any) -> None:
        if type(dbapi_conn).__module__.startswith("sqlite3"):
            dbapi_conn.execute("PRAGMA synchronous=OFF")

    sa.event.listen(Engine, "connect", connect)
    try:
        yield
    finally:
        sa.event.remove(Engine, "connect", connect)
        _dispose_our_engines()


def _dispose_our_engines() -> None:
    for url, engine in list(kit_db._engines.items()):
        engine.dispose()
        kit_db._engines.pop(url, None)


def _open(home: Path, pg_url: str | None) -> DagsterInstance:
    if pg_url:
        os.environ["DAGSTER_PG_URL"] = pg_url
    return DagsterInstance.from_ref(InstanceRef.from_dir(str(home)))


def _entry(run: DagsterRun, kind: str, t: float) -> EventLogEntry:
    event = DagsterEvent(event_type_value=kind, job_name=run.job_name, message=kind)
    return EventLogEntry(
        error_info=None,
        level=20,
        user_message=kind,
        run_id=run.run_id,
        timestamp=t,
        dagster_event=event,
    )


def _engine_event(run: DagsterRun, t: float) -> EventLogEntry:
    from dagster._core.events import EngineEventData

    event = DagsterEvent(
        event_type_value="ENGINE_EVENT",
        job_name=run.job_name,
        message="working",
        event_specific_data=EngineEventData(),
    )
    return EventLogEntry(None, 20, "working", run.run_id, t, dagster_event=event)


def build_store(instance: DagsterInstance, n_runs: int) -> list[str]:
    """N finished runs in lineages of two, ended 40 days ago; returns their run ids."""
    from durable_assets.kit.db import DurableDatabase

    ended = time.time() - 40 * DAY_S
    storage: Any = instance.event_log_storage
    sharded = bool(storage.is_run_sharded)
    template = None
    if sharded:
        with storage.run_connection("shard-template"):
            pass
        template = storage.path_for_shard("shard-template")
    runs: list[DagsterRun] = []
    batch_ids = [f"bench-{k:06d}" for k in range((n_runs + RUNS_PER_BATCH - 1) // RUNS_PER_BATCH)]
    for k in range(n_runs):
        batch_id = batch_ids[k // RUNS_PER_BATCH]
        status = DagsterRunStatus.FAILURE if k % RUNS_PER_BATCH == 0 else DagsterRunStatus.SUCCESS
        tags = {BATCH_TAG: batch_id, "dagster/partition": batch_id}
        run = DagsterRun(job_name="refund_batch", run_id=make_new_run_id(), tags=tags, status=status)
        instance.add_run(run)
        runs.append(run)
    with instance.run_storage.connect() as conn:  # type: ignore[attr-defined]
        for chunk in range(0, n_runs, _CHUNK):
            ids = [r.run_id for r in runs[chunk : chunk + _CHUNK]]
            conn.execute(
                RunsTable.update()
                .where(RunsTable.c.run_id.in_(ids))
                .values(start_time=ended - 60, end_time=ended)
            )
    events: dict[str, list[EventLogEntry]] = {}
    for run in runs:
        end = "PIPELINE_FAILURE" if run.status == DagsterRunStatus.FAILURE else "PIPELINE_SUCCESS"
        events[run.run_id] = [
            _entry(run, "PIPELINE_START", ended - 60),
            _engine_event(run, ended - 30),
            _entry(run, end, ended),
        ]
    if sharded:
        assert template is not None
        for run in runs:
            shutil.copyfile(template, storage.path_for_shard(run.run_id))
            shard = sa.create_engine(storage.conn_string_for_shard(run.run_id), poolclass=sa.pool.NullPool)
            with shard.begin() as conn:
                conn.execute(storage.prepare_insert_event_batch(events[run.run_id]))
            shard.dispose()
        os.unlink(template)
        # Dagster mirrors run-status events into the index shard; so do we.
        mirrored = [e for run in runs for e in (events[run.run_id][0], events[run.run_id][2])]
    else:
        mirrored = [e for run in runs for e in events[run.run_id]]
    for chunk in range(0, len(mirrored), _CHUNK):
        with storage.index_connection() as conn:
            conn.execute(storage.prepare_insert_event_batch(mirrored[chunk : chunk + _CHUNK]))
    instance.add_dynamic_partitions("batches", batch_ids)
    db = DurableDatabase.for_instance(instance)
    with db.transaction() as conn:
        conn.execute(
            kit_db.progress.insert(),
            [
                {
                    "batch_id": b,
                    "run_id": "r",
                    "step": 7,
                    "total": 7,
                    "label": "done",
                    "done": 1,
                    "of": 1,
                    "updated_at": ended,
                }
                for b in batch_ids
            ],
        )
    return [r.run_id for r in runs]


def _check_store(instance: DagsterInstance, run_ids: list[str]) -> None:
    """The fast-built store reads back like a real one, through the instance API."""
    sample = run_ids[1]
    record = instance.get_run_record_by_id(sample)
    assert record is not None and record.end_time is not None
    assert len(instance.all_logs(sample)) == 3
    assert (
        len(instance.get_run_records(RunsFilter(tags={BATCH_TAG: record.dagster_run.tags[BATCH_TAG]}))) == 2
    )


def _shard_bytes(instance: DagsterInstance, run_ids: list[str]) -> float:
    """Bytes still on disk in these runs' SQLite shard files (0 on Postgres)."""
    storage: Any = instance.event_log_storage
    if not storage.is_run_sharded:
        return 0.0
    paths = (Path(storage.path_for_shard(rid)) for rid in run_ids)
    return float(sum(p.stat().st_size for p in paths if p.exists()))


@contextlib.contextmanager
def _pg_databases(base_url: str) -> Iterator[tuple[str, str]]:
    import psycopg2

    tag = uuid.uuid4().hex[:10]
    names = [f"prune_bench_{tag}_{side}" for side in ("ours", "base")]
    admin = psycopg2.connect(f"{base_url}/postgres")
    admin.autocommit = True
    try:
        admin.cursor().execute(f'CREATE DATABASE "{names[0]}"')
        yield f"{base_url}/{names[0]}", f"{base_url}/{names[1]}"
    finally:
        _dispose_our_engines()
        for name in names:  # each on its own: one failed drop must not leak the other
            try:
                admin.cursor().execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
            except Exception as exc:
                print(f"prune_bench: could not drop scratch database {name}: {exc}", file=sys.stderr)
        admin.close()


def measure(
    n_runs: int, postgres_base_url: str | None = None, baseline_sample: int | None = 1000
) -> dict[str, float]:
    """Prune ``n_runs`` runs our way and Dagster's way on identical stores; runs per second each.

    Dagster's one-by-one delete runs at a steady rate (every run costs the same), so by default its
    rate is measured on the first ``baseline_sample`` runs of the identical store, not all of them:
    at 5,000 runs it would otherwise add tens of minutes. ``baseline_sample=None`` deletes all.
    """
    with tempfile.TemporaryDirectory(prefix="prune-bench-") as tmp, contextlib.ExitStack() as stack:
        home_ours, home_base = Path(tmp) / "ours", Path(tmp) / "base"
        home_ours.mkdir()
        pg_ours = pg_base = None
        if postgres_base_url:
            pg_ours, pg_base = stack.enter_context(_pg_databases(postgres_base_url))
            shutil.copy(REPO / "dagster_home" / "postgres" / "dagster.yaml", home_ours / "dagster.yaml")
        else:
            (home_ours / "dagster.yaml").write_text("telemetry:\n  enabled: false\n")

        with _no_fsync_while_building():
            instance = _open(home_ours, pg_ours)
            run_ids = build_store(instance, n_runs)
            _check_store(instance, run_ids)
            instance.dispose()
        shutil.copytree(home_ours, home_base)
        if pg_ours and pg_base:
            import psycopg2

            admin = psycopg2.connect(f"{postgres_base_url}/postgres")
            admin.autocommit = True
            base_name, ours_name = pg_base.rsplit("/", 1)[1], pg_ours.rsplit("/", 1)[1]
            admin.cursor().execute(f'CREATE DATABASE "{base_name}" TEMPLATE "{ours_name}"')
            admin.close()

        instance = _open(home_ours, pg_ours)
        policy = RetentionPolicy(completed_days=30, failed_days=30)
        started = time.perf_counter()
        report = prune_batches(instance, policy=policy)
        ours_s = time.perf_counter() - started
        assert report.runs == n_runs and not report.skipped, report.as_dict()
        assert not instance.get_run_records(RunsFilter(tags={BATCH_TAG: "bench-000000"}))
        ours_left = _shard_bytes(instance, run_ids) / n_runs
        instance.dispose()
        _dispose_our_engines()

        baseline = _open(home_base, pg_base)
        base_runs = run_ids if baseline_sample is None else run_ids[:baseline_sample]
        started = time.perf_counter()
        for run_id in base_runs:
            baseline.delete_run(run_id)
        base_s = time.perf_counter() - started
        assert baseline.get_run_record_by_id(run_ids[0]) is None
        base_left = _shard_bytes(baseline, base_runs) / len(base_runs)
        baseline.dispose()

    ours_rate, base_rate = n_runs / ours_s, len(base_runs) / base_s
    return {
        "runs": float(n_runs),
        "seconds": round(ours_s, 2),
        "runs_per_s": round(ours_rate, 1),
        "baseline_runs_per_s": round(base_rate, 1),
        "ratio": round(ours_rate / base_rate, 2),
        "baseline_runs": float(len(base_runs)),
        "baseline_seconds": round(base_s, 2),
        "disk_bytes_left_per_run": ours_left,
        "baseline_disk_bytes_left_per_run": base_left,
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("n_runs", type=int, nargs="?", default=5000)
    parser.add_argument("--postgres", metavar="URL", help="server URL without a database name")
    parser.add_argument("--full-baseline", action="store_true", help="baseline deletes all N runs, too")
    args = parser.parse_args()
    print(json.dumps(measure(args.n_runs, args.postgres, None if args.full_baseline else 1000)))


if __name__ == "__main__":
    main()
