"""The daily refund schedule: one batch per day however often its tick is evaluated, and backfill."""

from __future__ import annotations

import dataclasses
import json
import os
import re
from datetime import UTC, date, datetime
from pathlib import Path

import pytest
from dagster import DagsterInstance, DagsterRunStatus, RunsFilter, build_schedule_context, validate_run_config

from durable_assets.definitions import defs
from durable_assets.kit.modes import ExecutorKind
from durable_assets.kit.tags import BATCH_TAG, EXECUTOR_TAG
from durable_assets.ops.registry import durable_jobs
from durable_assets.ops.runner import start_batch
from durable_assets.refunds.schedules import DAILY_REFUNDS, DAILY_SCHEDULE
from tests.support.schedule_ticks import crash_mid_tick_then_tick_again

from .conftest import job_cli

daily_batch_id = DAILY_REFUNDS.batch_id

TICK = datetime(2026, 11, 29, 2, 0, tzinfo=UTC)
BATCH = "daily-2026-11-29"


def test_schedule_ships_stopped_and_names_the_batch_after_the_day() -> None:
    sched = defs.resolve_schedule_def(DAILY_SCHEDULE)
    assert sched.default_status.value == "STOPPED"
    assert sched.cron_schedule == "0 2 * * *" and sched.execution_timezone == "UTC"
    assert daily_batch_id(date(2026, 11, 29)) == BATCH


@pytest.mark.slow
def test_tick_evaluated_twice_by_the_daemon_creates_one_batch(dagster_home: Path) -> None:
    """The scheduler's own tick logic: the daemon dies after launching the run, then re-does the tick."""
    with DagsterInstance.get() as instance:
        story = crash_mid_tick_then_tick_again(instance, DAILY_SCHEDULE, TICK, BATCH)
        # The run was launched, but the tick never recorded it: exactly the state a re-do must handle.
        run = story.one_queued_run(BATCH)
        assert instance.get_dynamic_partitions("batches") == [BATCH]

    # The CLI sees the scheduled batch like any other.
    status = job_cli("status", "--id", BATCH, "--json")
    assert status.returncode == 0, status.stderr
    assert json.loads(status.stdout)["run_ids"] == [run.run_id]


def test_a_day_whose_batch_already_ran_is_skipped_not_started_again(dagster_home: Path) -> None:
    """Evaluations by hand ("Test schedule" in the UI) or after a CLI run of the same ID start nothing."""
    sched = defs.resolve_schedule_def(DAILY_SCHEDULE)
    repo = defs.get_repository_def()
    with DagsterInstance.get() as instance:
        first = sched.evaluate_tick(build_schedule_context(instance, TICK, repository_def=repo))
        again = sched.evaluate_tick(build_schedule_context(instance, TICK, repository_def=repo))
        assert [r.run_key for r in first.run_requests or []] == [BATCH]
        assert [r.run_key for r in again.run_requests or []] == [BATCH]  # nothing ran yet: same request
        assert instance.get_dynamic_partitions("batches") == [BATCH]  # added once

        run = start_batch(instance, BATCH, size=40)
        assert run.status == DagsterRunStatus.SUCCESS
        after = sched.evaluate_tick(build_schedule_context(instance, TICK, repository_def=repo))
        assert not after.run_requests
        assert after.skip_message and BATCH in after.skip_message and "job status" in after.skip_message


@pytest.mark.slow
def test_backfill_runs_each_day_once_and_is_idempotent(dagster_home: Path) -> None:
    first = job_cli("backfill", "--from", "2026-11-01", "--to", "2026-11-02", timeout=300)
    assert first.returncode == 0, first.stderr
    assert "daily-2026-11-01: succeeded" in first.stdout and "daily-2026-11-02: succeeded" in first.stdout
    again = job_cli("backfill", "--from", "2026-11-01", "--to", "2026-11-02", timeout=300)
    assert again.returncode == 0, again.stderr
    assert again.stdout.count("already succeeded") == 2
    with DagsterInstance.get() as instance:
        for bid in ("daily-2026-11-01", "daily-2026-11-02"):
            assert len(instance.get_runs(RunsFilter(tags={BATCH_TAG: bid}))) == 1


def test_backfill_says_why_a_day_failed(dagster_home: Path, tmp_path: Path) -> None:
    """A day whose input is missing prints its one-line reason, not only "failed" (#21 item 6)."""
    env = {**os.environ, "DURABLE_DAILY_INVOICES": str(tmp_path / "missing-{date}.csv")}
    result = job_cli("backfill", "--from", "2026-11-03", "--to", "2026-11-03", env=env, timeout=300)
    assert result.returncode == 1, (result.stdout, result.stderr)
    [line] = [x for x in result.stdout.splitlines() if x.startswith("day 1/1 daily-2026-11-03: failed")]
    assert re.match(r"day 1/1 daily-2026-11-03: failed in [0-9.]+ s at invoices: ", line), line
    assert "missing-2026-11-03.csv" in line, line


def test_backfill_of_a_day_with_held_items_says_held_and_exits_4(dagster_home: Path, tmp_path: Path) -> None:
    """A day that succeeded with an item waiting for a person is not a clean success (#35 item 5):
    the day's line says how many are held, the exit is 4 as for `job run`, and again when the same
    range is backfilled once more (the day is not run again)."""
    (tmp_path / "invoices-2026-11-05.csv").write_text(
        "invoice_id,customer_id,customer_email,charge_id,currency,amount_charged,contracted_amount,"
        "already_refunded,service_period,charged_at,cancelled_at\n"
        # The charge does not exist at the provider: its refund is held for review.
        "I1,C1,a@x.com,ch_missing,usd,12.00,10.00,0,2026-10,2026-10-01T00:00:00Z,\n"
    )
    env = {**os.environ, "DURABLE_DAILY_INVOICES": str(tmp_path / "invoices-{date}.csv")}
    day = ("backfill", "--from", "2026-11-05", "--to", "2026-11-05")
    first = job_cli(*day, env=env, timeout=300)
    assert first.returncode == 4, (first.stdout, first.stderr)
    assert re.search(r"daily-2026-11-05: succeeded, 1 held for review .* in [0-9.]+ s", first.stdout)
    again = job_cli(*day, env=env, timeout=300)
    assert again.returncode == 4, (again.stdout, again.stderr)
    assert "daily-2026-11-05: already succeeded, 1 held for review" in again.stdout


@pytest.mark.parametrize(
    ("first", "last"),
    [("2026-11-02", "2026-11-01"), ("2026-13-01", "2026-12-01"), ("2024-01-01", "2026-01-01")],
)
def test_backfill_rejects_bad_ranges_as_usage_errors(first: str, last: str, dagster_home: Path) -> None:
    result = job_cli("backfill", "--from", first, "--to", last)
    assert result.returncode == 2, (result.stdout, result.stderr)
    assert "Traceback" not in result.stderr


@pytest.mark.parametrize(
    ("own", "deployment"), [(None, "celery"), (ExecutorKind.CELERY, "in_process"), (None, "in_process")]
)
def test_a_schedule_launches_its_batches_on_the_workers_when_configured(
    dagster_home: Path, own: ExecutorKind | None, deployment: str
) -> None:
    """DURABLE_SCHEDULE_EXECUTOR (or a job's own DailyBatches(executor=...), which wins) makes each
    day's request select the celery executor as the launchpad does: run config and tag."""
    durable = durable_jobs().get("refund_batch")
    daily = dataclasses.replace(DAILY_REFUNDS, executor=own)
    job = defs.resolve_job_def("refund_batch")
    with DagsterInstance.get() as instance:
        context = build_schedule_context(
            instance=instance, scheduled_execution_time=TICK, repository_def=defs.get_repository_def()
        )
        (request,) = daily.schedule(durable, deployment).evaluate_tick(context).run_requests or []
    distributed = own == ExecutorKind.CELERY or deployment == "celery"
    assert request.tags.get(EXECUTOR_TAG) == ("celery" if distributed else None), request.tags
    assert ("execution" in request.run_config) == distributed, request.run_config
    assert validate_run_config(job, request.run_config)  # the job's executor accepts the choice
    if distributed:
        assert request.run_config["execution"] == {"config": {"celery": {}}}
