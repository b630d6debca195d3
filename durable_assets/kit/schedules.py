"""One batch per day for a durable job, named after the day, started by Dagster's scheduler.

Why the ID is the date (``daily-2026-11-29``): a day's batch must be the same batch however often
its tick is evaluated — a daemon that crashed mid-tick re-evaluates it, a person may press "Test
schedule" in the UI. So the request is idempotent three ways: the dynamic partition is added only
if missing, the run request's ``run_key`` is the batch ID (the scheduler never launches a key twice
for one tick), and a day whose batch already has a started run (from this schedule, the CLI or the
UI) is skipped, never started a second time. Its runs carry ``durable/batch`` like CLI batches, so
``job status`` and ``job resume`` treat them the same.

Schedules ship STOPPED: nothing moves money until someone turns them on.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from datetime import UTC, date, datetime
from typing import TYPE_CHECKING, Any

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

from durable_assets.kit.executor import execution_config
from durable_assets.kit.modes import ExecutorKind
from durable_assets.kit.tags import BATCH_TAG, EXECUTOR_TAG, PARTITION_TAG

if TYPE_CHECKING:
    from durable_assets.kit.job import DurableJob


@dataclass(frozen=True)
class DailyBatches:
    """How a job's daily batch is named, fed and scheduled.

    ``input_env`` names an environment variable holding a path template with ``{date}``
    (e.g. ``/data/export/{date}.csv``); unset, the day's batch is synthetic (demos). ``executor``
    is where the day's steps run (``celery``: on `job worker`s, one task per step); None leaves
    it to the deployment (``DURABLE_SCHEDULE_EXECUTOR``, given to :meth:`schedule`).
    """

    schedule_name: str
    id_prefix: str
    input_env: str
    cron: str = "0 2 * * *"
    description: str = ""
    executor: ExecutorKind | None = None

    def batch_id(self, day: date) -> str:
        return f"{self.id_prefix}-{day.isoformat()}"

    def input_path(self, day: date) -> str | None:
        template = os.environ.get(self.input_env)
        return template.format(date=day.isoformat()) if template else None

    def run_request(
        self,
        job: DurableJob,
        instance: DagsterInstance,
        day: date,
        executor: ExecutorKind = ExecutorKind.IN_PROCESS,
    ) -> RunRequest | SkipReason:
        """The request for ``day``'s batch, or why there is none; safe to evaluate any number of times.

        A distributed day (``executor`` celery) says so twice, as a launch from the UI can: in the
        run config (Dagster's executor selection, shown on the run's page) and in the run's tag.
        """
        batch_id = self.batch_id(day)
        existing = started_runs(instance, batch_id)
        if existing:
            return SkipReason(
                f"batch {batch_id} already exists (run {existing[0].run_id}); "
                f"`job status --id {batch_id}` shows it, `job resume --id {batch_id}` continues it"
            )
        if not instance.has_dynamic_partition(job.partitions_name, batch_id):
            instance.add_dynamic_partitions(job.partitions_name, [batch_id])
        path = self.input_path(day)
        step = job.steps[0].key
        run_config: dict[str, Any] = {"ops": {step: {"config": {"path": path} if path else {}}}}
        tags = {BATCH_TAG: batch_id}
        if executor == ExecutorKind.CELERY:
            run_config |= execution_config(executor)
            tags[EXECUTOR_TAG] = executor.value
        return RunRequest(run_key=batch_id, partition_key=batch_id, tags=tags, run_config=run_config)

    def schedule(
        self, job: DurableJob, deployment_executor: str = ExecutorKind.IN_PROCESS.value
    ) -> ScheduleDefinition:
        """The job's daily schedule; its batches run on ``self.executor``, else ``deployment_executor``."""
        executor = self.executor or ExecutorKind(deployment_executor)
        where = " Steps run on `job worker`s (celery)." if executor == ExecutorKind.CELERY else ""

        @schedule(
            name=self.schedule_name,
            job=job.asset_job,
            cron_schedule=self.cron,
            execution_timezone="UTC",
            default_status=DefaultScheduleStatus.STOPPED,
            description=(
                f"{self.description} One batch per day, ID {self.id_prefix}-YYYY-MM-DD (the tick's UTC "
                f"date). Ships stopped: turn it on deliberately. Input: ${self.input_env} with {{date}}, "
                f"else synthetic.{where}"
            ).strip(),
        )
        def _daily(context: ScheduleEvaluationContext) -> RunRequest | SkipReason:
            when = context.scheduled_execution_time or datetime.now(UTC)
            return self.run_request(job, context.instance, when.astimezone(UTC).date(), executor)

        return _daily


def started_runs(instance: DagsterInstance, batch_id: str) -> list[Any]:
    """Runs of the batch that were ever started, whichever path (CLI, UI, schedule) created them."""
    runs = {
        r.run_id: r
        for tag in (BATCH_TAG, PARTITION_TAG)
        for r in instance.get_runs(RunsFilter(tags={tag: batch_id}))
    }
    return [r for r in runs.values() if r.status != DagsterRunStatus.NOT_STARTED]
