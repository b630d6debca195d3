"""The nightly credit migration schedule: one batch per night however often its tick is evaluated."""

from __future__ import annotations

import json
from datetime import UTC, date, datetime, timedelta
from pathlib import Path

import pytest
from dagster import DagsterInstance, DagsterRunStatus, RunRequest, build_schedule_context

from durable_assets.credit_migration.assets import CREDIT_BATCHES
from durable_assets.credit_migration.job import CREDIT_JOB
from durable_assets.credit_migration.schedules import EXPORT_TEMPLATE_ENV, NIGHTLY_CREDITS, NIGHTLY_SCHEDULE
from durable_assets.definitions import defs
from durable_assets.kit.tags import BATCH_TAG
from durable_assets.ops.runner import start_batch
from durable_assets.refunds.schedules import DAILY_SCHEDULE
from tests.support.schedule_ticks import crash_mid_tick_then_tick_again

from ..conftest import job_cli

TICK = datetime(2026, 11, 29, 3, 0, tzinfo=UTC)
BATCH = "credits-2026-11-29"
PARTITIONS = CREDIT_BATCHES.name or "credit_batches"


def _evaluate(instance: DagsterInstance, at: datetime = TICK) -> RunRequest | None:
    """One evaluation of the schedule (what "Test schedule" in the UI does); None when it skips."""
    sched = defs.resolve_schedule_def(NIGHTLY_SCHEDULE)
    ctx = build_schedule_context(instance, at, repository_def=defs.get_repository_def())
    data = sched.evaluate_tick(ctx)
    requests = data.run_requests or []
    assert len(requests) <= 1, requests
    return requests[0] if requests else None


def test_schedule_ships_stopped_and_names_the_batch_after_the_night() -> None:
    sched = defs.resolve_schedule_def(NIGHTLY_SCHEDULE)
    assert sched.default_status.value == "STOPPED"
    assert sched.cron_schedule == "0 3 * * *" and sched.execution_timezone == "UTC"
    assert sched.job_name == CREDIT_JOB
    assert NIGHTLY_CREDITS.batch_id(date(2026, 11, 29)) == BATCH
    assert NIGHTLY_SCHEDULE != DAILY_SCHEDULE
    assert "credits-YYYY-MM-DD" in (sched.description or "")
    assert EXPORT_TEMPLATE_ENV == "DURABLE_NIGHTLY_CREDITS"


def test_the_tick_requests_the_nights_batch_with_a_synthetic_export(
    dagster_home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(EXPORT_TEMPLATE_ENV, raising=False)
    with DagsterInstance.get() as instance:
        request = _evaluate(instance)
        assert request is not None
        assert request.run_key == BATCH and request.partition_key == BATCH
        assert request.tags[BATCH_TAG] == BATCH
        assert request.run_config == {"ops": {"legacy_accounts": {"config": {}}}}
        assert instance.get_dynamic_partitions(PARTITIONS) == [BATCH]
        assert instance.get_dynamic_partitions("batches") == []  # not the refund job's partitions


@pytest.mark.parametrize(
    ("template", "expected"),
    [
        ("/data/legacy/credits-{date}.csv", "/data/legacy/credits-2026-11-29.csv"),
        ("/data/{date}/export.parquet", "/data/2026-11-29/export.parquet"),
    ],
)
def test_the_nights_input_comes_from_the_templated_variable(
    template: str, expected: str, dagster_home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(EXPORT_TEMPLATE_ENV, template)
    with DagsterInstance.get() as instance:
        request = _evaluate(instance)
        assert request is not None
        assert request.run_config == {"ops": {"legacy_accounts": {"config": {"path": expected}}}}
        # The next night reads the next night's file.
        tomorrow = _evaluate(instance, TICK + timedelta(days=1))
        assert tomorrow is not None and tomorrow.run_key == "credits-2026-11-30"
        assert tomorrow.run_config["ops"]["legacy_accounts"]["config"]["path"] == expected.replace(
            "2026-11-29", "2026-11-30"
        )


def test_a_night_whose_batch_already_ran_is_skipped_not_started_again(dagster_home: Path) -> None:
    with DagsterInstance.get() as instance:
        first, again = _evaluate(instance), _evaluate(instance)
        assert first is not None and again is not None
        assert first.run_key == again.run_key == BATCH  # nothing ran yet: the same request
        assert instance.get_dynamic_partitions(PARTITIONS) == [BATCH]  # added once

        run = start_batch(instance, BATCH, job=CREDIT_JOB, size=20)
        assert run.status == DagsterRunStatus.SUCCESS
        sched = defs.resolve_schedule_def(NIGHTLY_SCHEDULE)
        after = sched.evaluate_tick(
            build_schedule_context(instance, TICK, repository_def=defs.get_repository_def())
        )
        assert not after.run_requests
        assert after.skip_message and BATCH in after.skip_message and "job status" in after.skip_message


def test_an_id_taken_by_the_other_job_is_not_reused(dagster_home: Path) -> None:
    """Batch IDs are unique across jobs: a refund batch that happens to be named like the night
    keeps the name, and the night's credit migration is skipped rather than sharing it."""
    with DagsterInstance.get() as instance:
        run = start_batch(instance, BATCH, size=20)  # the default job: refunds
        assert run.status == DagsterRunStatus.SUCCESS
        assert _evaluate(instance) is None
        assert instance.get_dynamic_partitions(PARTITIONS) == []


@pytest.mark.slow
def test_tick_evaluated_twice_by_the_daemon_creates_one_batch(dagster_home: Path) -> None:
    """The scheduler's own tick logic: the daemon dies after launching the run, then re-does the tick."""
    with DagsterInstance.get() as instance:
        story = crash_mid_tick_then_tick_again(instance, NIGHTLY_SCHEDULE, TICK, BATCH)
        # The run was launched, but the tick never recorded it: exactly the state a re-do must handle.
        run = story.one_queued_run(BATCH)
        assert run.job_name == CREDIT_JOB
        assert instance.get_dynamic_partitions(PARTITIONS) == [BATCH]

    status = job_cli("status", "--id", BATCH, "--json")
    assert status.returncode == 0, status.stderr
    body = json.loads(status.stdout)
    assert body["run_ids"] == [run.run_id] and body["job"] == CREDIT_JOB
    assert [step["step_name"] for step in body["steps"]][:1] == ["legacy_accounts"]
