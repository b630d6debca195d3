"""Progress reports reach the run's Dagster event log, throttled, and read back as they were sent."""

from __future__ import annotations

import time
from pathlib import Path

from dagster import DagsterEventType, DagsterInstance, DagsterRun, DagsterRunStatus

from durable_assets.kit.db import DurableDatabase
from durable_assets.kit.progress import (
    Progress,
    ProgressReporter,
    ProgressStore,
    event_log_sink,
    progress_from_event,
)


def test_reports_round_trip_through_the_event_log_and_the_throttle_holds(dagster_home: Path) -> None:
    instance = DagsterInstance.get()
    run = instance.add_run(DagsterRun(job_name="j", run_id="run-1", status=DagsterRunStatus.STARTED))
    store = ProgressStore(DurableDatabase.for_instance(instance))
    reporter = ProgressReporter(
        store, "b", run.run_id, min_interval_s=3600, sink=event_log_sink(instance, run)
    )

    reporter.report(Progress(4, 7, "Issuing refunds", 0, 0), force=True)
    for done in range(1, 100):
        reporter.report(Progress(4, 7, "Issuing refunds", done, 100))  # throttled away
    reporter.report(Progress(4, 7, "Issuing refunds", 100, 100))  # the last one always goes
    reporter.close()

    records = instance.get_records_for_run(run.run_id, of_type=DagsterEventType.ENGINE_EVENT).records
    sent = [progress_from_event(r.event_log_entry.dagster_event) for r in records]
    assert sent == [Progress(4, 7, "Issuing refunds", 0, 0), Progress(4, 7, "Issuing refunds", 100, 100)]
    assert store.latest("b") == Progress(4, 7, "Issuing refunds", 100, 100)


def test_the_event_log_gets_fewer_reports_than_the_row_but_every_first_and_last(dagster_home: Path) -> None:
    """Issue #37: the row takes every report that passes the throttle (status and percent read it);
    the event log one per ``event_interval_s`` besides the forced and the last."""
    instance = DagsterInstance.get()
    run = instance.add_run(DagsterRun(job_name="j", run_id="run-3", status=DagsterRunStatus.STARTED))
    rows: list[Progress] = []

    class Store(ProgressStore):
        def write(self, batch_id: str, run_id: str, p: Progress) -> None:
            rows.append(p)
            super().write(batch_id, run_id, p)

    store = Store(DurableDatabase.for_instance(instance))
    reporter = ProgressReporter(
        store, "b", run.run_id, min_interval_s=0, sink=event_log_sink(instance, run), event_interval_s=3600
    )
    reporter.report(Progress(4, 7, "Issuing refunds", 0, 0), force=True)
    for done in range(1, 5):
        reporter.report(Progress(4, 7, "Issuing refunds", done, 5))
        reporter.flush()
    reporter.report(Progress(4, 7, "Issuing refunds", 5, 5), force=True)
    reporter.close()

    assert [p.done for p in rows] == [0, 1, 2, 3, 4, 5]
    records = instance.get_records_for_run(run.run_id, of_type=DagsterEventType.ENGINE_EVENT).records
    sent = [progress_from_event(r.event_log_entry.dagster_event) for r in records]
    assert sent == [Progress(4, 7, "Issuing refunds", 0, 0), Progress(4, 7, "Issuing refunds", 5, 5)]


def test_other_engine_events_are_not_progress(dagster_home: Path) -> None:
    instance = DagsterInstance.get()
    run = instance.add_run(DagsterRun(job_name="j", run_id="run-2", status=DagsterRunStatus.STARTED))
    instance.report_engine_event("something else", run)
    records = instance.get_records_for_run(run.run_id, of_type=DagsterEventType.ENGINE_EVENT).records
    assert [progress_from_event(r.event_log_entry.dagster_event) for r in records] == [None]


def test_a_slow_store_does_not_hold_up_the_step_and_the_newest_report_wins(dagster_home: Path) -> None:
    written: list[Progress] = []

    class SlowStore:
        def write(self, _batch_id: str, _run_id: str, p: Progress) -> None:
            time.sleep(0.2)  # a database under load
            written.append(p)

    reporter = ProgressReporter(SlowStore(), "b", "r", min_interval_s=0)  # type: ignore[arg-type]
    started = time.perf_counter()
    for done in range(50):
        reporter.report(Progress(4, 7, "Issuing refunds", done, 100))
    handed_over = time.perf_counter() - started
    reporter.report(Progress(4, 7, "Issuing refunds", 100, 100), force=True)  # waits: stored before return
    assert written[-1] == Progress(4, 7, "Issuing refunds", 100, 100)
    assert handed_over < 0.15, f"50 reports held the step up for {handed_over:.2f} s"
    assert len(written) < 10  # older pending reports were superseded, not queued
    reporter.close()
