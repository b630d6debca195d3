"""The daily refund batch: one batch per day, named after the day, started by Dagster's scheduler.

Why the ID is the date (``daily-2026-11-29``): a day's batch must be the same batch however often
its tick is evaluated — a daemon that crashed mid-tick re-evaluates it, a person may press "Test
schedule" in the UI. So the request is idempotent three ways: the dynamic partition is added only
if missing, the run request's ``run_key`` is the batch ID (the scheduler never launches a key twice
for one tick), and a day whose batch already has a started run (from this schedule, the CLI or the
UI) is skipped, never started a second time. Its runs carry ``durable/batch`` like CLI batches, so
``job status --id daily-…`` and ``job resume`` treat them the same.

The schedule ships STOPPED: nothing refunds money until someone turns it on.
"""

from __future__ import annotations

import os
from datetime import UTC, date, datetime
from typing import Any

from dagster import (
    DagsterInstance,
    DagsterRunStatus,
    DefaultScheduleStatus,
    RunRequest,
    RunsFilter,
    ScheduleDefinition,
    ScheduleEvaluationContext,
    SkipReason,
    schedule,
)
from dagster._core.definitions.unresolved_asset_job_definition import UnresolvedAssetJobDefinition

from durable_assets.kit.resources import BATCH_TAG
from durable_assets.refunds.assets import BATCHES

DAILY_SCHEDULE = "daily_refund_batch"
#: 02:00 UTC: the previous day's invoices are final by then.
DAILY_CRON = "0 2 * * *"
#: A file per day, e.g. ``/data/invoices/{date}.csv``; unset = a synthetic batch (demos).
INVOICES_TEMPLATE_ENV = "DURABLE_DAILY_INVOICES"
PARTITION_TAG = "dagster/partition"


def daily_batch_id(day: date) -> str:
    return f"daily-{day.isoformat()}"


def daily_invoice_config(day: date) -> dict[str, Any]:
    """The ``invoices`` op config for a day: the day's file when a template is set, else synthetic."""
    template = os.environ.get(INVOICES_TEMPLATE_ENV)
    return {"path": template.format(date=day.isoformat())} if template else {}


def started_runs(instance: DagsterInstance, batch_id: str) -> list[Any]:
    """Runs of the batch that were ever started, whichever path (CLI, UI, schedule) created them."""
    runs = {
        r.run_id: r
        for tag in (BATCH_TAG, PARTITION_TAG)
        for r in instance.get_runs(RunsFilter(tags={tag: batch_id}))
    }
    return [r for r in runs.values() if r.status != DagsterRunStatus.NOT_STARTED]


def daily_run_request(instance: DagsterInstance, day: date) -> RunRequest | SkipReason:
    """The request for ``day``'s batch, or why there is none; safe to evaluate any number of times."""
    batch_id = daily_batch_id(day)
    existing = started_runs(instance, batch_id)
    if existing:
        return SkipReason(
            f"batch {batch_id} already exists (run {existing[0].run_id}); "
            f"`job status --id {batch_id}` shows it, `job resume --id {batch_id}` continues it"
        )
    partitions = BATCHES.name or "batches"
    if not instance.has_dynamic_partition(partitions, batch_id):
        instance.add_dynamic_partitions(partitions, [batch_id])
    return RunRequest(
        run_key=batch_id,
        partition_key=batch_id,
        tags={BATCH_TAG: batch_id},
        run_config={"ops": {"invoices": {"config": daily_invoice_config(day)}}},
    )


def build_daily_schedule(job: UnresolvedAssetJobDefinition) -> ScheduleDefinition:
    @schedule(
        name=DAILY_SCHEDULE,
        job=job,
        cron_schedule=DAILY_CRON,
        execution_timezone="UTC",
        default_status=DefaultScheduleStatus.STOPPED,
        description=(
            "One refund batch per day, ID daily-YYYY-MM-DD (the tick's UTC date). Ships stopped: turn "
            f"it on deliberately. Input: ${INVOICES_TEMPLATE_ENV} with {{date}}, else synthetic."
        ),
    )
    def daily_refund_batch(context: ScheduleEvaluationContext) -> RunRequest | SkipReason:
        when = context.scheduled_execution_time or datetime.now(UTC)
        return daily_run_request(context.instance, when.astimezone(UTC).date())

    return daily_refund_batch
