"""A batch's terminal statuses as signed webhooks: which runs count, what is sent, and who sends it.

**Which runs count.** A batch's status is its newest run's (docs/contract.md), so an event is a run of
the batch that ended SUCCESS, FAILURE or CANCELED *and is still the newest run of the lineage* when
the event is enqueued, re-read from run storage (never trusted from an in-memory result or a
sensor's event: Dagster sensors were reported to fire SUCCESS for force-canceled runs). Not events:

- a run superseded by a later run of the batch (a resume or retry already moved the batch on);
- a FAILURE that Dagster's run retries will re-execute (``dagster/will_retry`` and no retry yet);
- a FAILURE written while another worker holds the batch's live lease: the dead run `job resume`
  marks failed right before re-executing it (the batch goes straight back to running);
- a FAILURE of a run whose worker was lost while the daemon's automatic resume has not decided
  yet (``durable/worker_lost`` without ``durable/auto_resumed_by``): if it resumes the batch, the
  resumed run's end is the event; if it declines, it enqueues this failure itself, with the reason.

Each event's ``webhook-id`` is derived from (batch, run, event type), so the CLI and the sensor,
or two CLIs, agree and the outbox's insert-ignore keeps one row per (event, URL). The body is
frozen at enqueue; just before each send the run's status is re-read once more and a row whose run
no longer ended that way is not sent (recorded as failed with the reason).

**Who sends.** The CLI process, right after the run it ran ends (no daemon needed), within a
bounded budget (``DURABLE_WEBHOOK_CLI_BUDGET_S``); leftovers stay pending. With the daemon, the
run-status sensors enqueue UI-, schedule- and retry-launched runs' events and the outbox sensor
retries every pending row each tick. `job resume` of a batch flushes its pending rows too.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from typing import Any

from dagster import (
    DagsterInstance,
    DagsterRun,
    DagsterRunStatus,
    DefaultSensorStatus,
    RunStatusSensorContext,
    SensorDefinition,
    SensorEvaluationContext,
    SkipReason,
    run_status_sensor,
    sensor,
)

from durable_assets.kit import DurableJobs
from durable_assets.kit.runtime import (
    AUTO_RESUMED_BY_TAG,
    BATCH_TAG,
    DurableDatabase,
    LeaseStore,
    now,
    worker_lost_reason,
)
from durable_assets.ops.code_changes import changes_only_a_person_may_cross
from durable_assets.ops.settings import AutoResumeSettings, WebhookVariables
from durable_assets.ops.status import batch_runs, batch_status, steps_to_run
from durable_assets.ops.status_model import BatchStatus
from durable_assets.ops.webhooks.outbox import (
    Deliverer,
    FlushReport,
    Outbox,
    OutboxRow,
    WebhookSettings,
    describe_pending,
    message_id,
)

#: The webhook ``type`` of each run status that ends a batch: ``batch.`` + the status word.
EVENT_TYPES = {
    status: f"batch.{BatchStatus.of_run(status)}"
    for status in (DagsterRunStatus.SUCCESS, DagsterRunStatus.FAILURE, DagsterRunStatus.CANCELED)
}


@dataclass(frozen=True)
class BatchEvent:
    batch_id: str
    run_id: str
    event_type: str
    webhook_id: str
    body: str


def settings() -> WebhookSettings | None:
    """The webhook configuration from the environment; raises early when it is unusable."""
    return WebhookSettings.from_env()


def cli_budget_s() -> float:
    return WebhookVariables.current().cli_budget_s


def terminal_event(instance: DagsterInstance, run_id: str) -> tuple[BatchEvent | None, str]:
    """The batch event this run's end is, re-read from storage; or None and why it is not one."""
    run = instance.get_run_by_id(run_id)
    if run is None:
        return None, f"run {run_id} is not in run storage"
    batch_id = run.tags.get(BATCH_TAG)
    if not batch_id:
        return None, f"run {run_id} carries no {BATCH_TAG} tag"
    event_type = EVENT_TYPES.get(run.status)
    if event_type is None:
        return None, f"run {run_id} is {run.status.value}, not a terminal status"
    newest = batch_runs(instance, batch_id)[-1]
    if newest.run_id != run.run_id:
        return None, f"run {run_id} was superseded by run {newest.run_id} of batch {batch_id!r}"
    if run.status == DagsterRunStatus.FAILURE:
        if run.remote_job_origin is not None and run.is_complete_and_waiting_to_retry:
            return None, f"run {run_id} failed and Dagster's run retries will re-execute it"
        if _awaits_automatic_resume(instance, run):
            return (
                None,
                f"run {run_id} lost its worker; the daemon's automatic resume has not decided yet "
                "whether the batch goes on",
            )
        lease = LeaseStore(DurableDatabase.for_instance(instance)).get(batch_id)
        if lease is not None and lease.is_live() and lease.run_id != run.run_id:
            return (
                None,
                f"batch {batch_id!r} is being taken over by {lease.owner}; run {run_id} is not its end",
            )
    record = instance.get_run_record_by_id(run_id)
    ended = record.end_time if record and record.end_time else now()
    payload = {
        "type": event_type,
        "timestamp": datetime.fromtimestamp(ended, tz=UTC).isoformat().replace("+00:00", "Z"),
        "data": batch_status(instance, batch_id).as_json(),
    }
    return (
        BatchEvent(
            batch_id=batch_id,
            run_id=run_id,
            event_type=event_type,
            webhook_id=message_id(batch_id, run_id, event_type),
            body=json.dumps(payload, separators=(",", ":")),
        ),
        "",
    )


def _awaits_automatic_resume(instance: DagsterInstance, run: DagsterRun) -> bool:
    """A lost worker's run the auto-resume sensor will judge (ops/auto_resume.py): it needs the queued
    run coordinator and at least one attempt, and tags the run once it has decided either way."""
    from dagster import QueuedRunCoordinator

    return (
        worker_lost_reason(run.tags) is not None
        and AUTO_RESUMED_BY_TAG not in run.tags
        and AutoResumeSettings.from_env().max_attempts > 0
        and isinstance(instance.run_coordinator, QueuedRunCoordinator)
    )


def announce_end(instance: DagsterInstance, run_id: str) -> str:
    """The daemon path's delayed end: a lost run the automatic resume declined to continue is the
    batch's end after all. Enqueued and delivered now; what fails stays for the outbox sensor."""
    config = settings()
    if config is None:
        return "webhooks off"
    event, why = enqueue(instance, config, run_id)
    if event is None:
        return f"no webhook: {why}"
    return f"{event.event_type}: {deliverer(instance, config).flush(batch_id=event.batch_id).summary()}"


def enqueue(instance: DagsterInstance, config: WebhookSettings, run_id: str) -> tuple[BatchEvent | None, str]:
    """Put the run's terminal event in the outbox once per URL (a repeat is a no-op)."""
    event, why = terminal_event(instance, run_id)
    if event is None:
        return None, why
    Outbox(DurableDatabase.for_instance(instance)).enqueue(**asdict(event), urls=config.urls)
    return event, ""


def still_true(instance: DagsterInstance) -> Callable[[OutboxRow], str | None]:
    """The last check before a send: did the row's run really end the way its event says?"""

    def check(row: OutboxRow) -> str | None:
        if not row.run_id:
            return None
        run = instance.get_run_by_id(row.run_id)
        if run is None:
            return f"run {row.run_id} is no longer in run storage"
        if EVENT_TYPES.get(run.status) != row.event_type:
            return f"run {row.run_id} is now {run.status.value}, not {row.event_type}"
        return None

    return check


def deliverer(instance: DagsterInstance, config: WebhookSettings) -> Deliverer:
    return Deliverer(Outbox(DurableDatabase.for_instance(instance)), config, check=still_true(instance))


def _stderr(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def notify_batch(
    instance: DagsterInstance,
    batch_id: str,
    *,
    budget_s: float | None = None,
    say: Callable[[str], None] = _stderr,
) -> FlushReport | None:
    """The CLI path: enqueue the batch's terminal event (if it has one) and deliver its pending rows.

    Bounded by ``budget_s`` (default ``DURABLE_WEBHOOK_CLI_BUDGET_S``): a dead receiver delays the
    command by at most that, and what is left is said and stays in the outbox for a later flush.
    """
    config = settings()
    if config is None:
        return None
    try:
        runs = batch_runs(instance, batch_id)
        if runs:
            enqueue(instance, config, runs[-1].run_id)
        report = deliverer(instance, config).flush(
            batch_id=batch_id, budget_s=cli_budget_s() if budget_s is None else budget_s
        )
    except Exception as exc:  # the batch's own outcome must not be lost to a webhook problem
        say(
            f"webhooks: batch {batch_id}: not delivered ({type(exc).__name__}: {exc}); "
            f"`job resume --id {batch_id}` retries"
        )
        return None
    if report.attempts:
        say(f"webhooks: batch {batch_id}: {report.summary()}")
    for row, why in report.failed:
        say(f"webhooks: gave up on {row.event_type} ({row.webhook_id}) to {row.url}: {why}")
    if report.pending:
        say(
            f"webhooks: left pending for a later flush (`job resume --id {batch_id}`, or the Dagster "
            f"daemon's webhook_outbox sensor): {describe_pending(report.pending)}"
        )
    return report


def enqueue_if_terminal(instance: DagsterInstance, run_id: str) -> None:
    """Before a resume moves the batch on: make sure the end it is leaving was enqueued."""
    config = settings()
    if config is not None:
        enqueue(instance, config, run_id)


# --- the daemon path ----------------------------------------------------------------------------


def note_code_changed(instance: DagsterInstance, run: DagsterRun, durable_jobs: DurableJobs | None) -> None:
    """Before a failure's body is frozen: a batch that only a person may resume across the code this
    location now serves says so in its status, so the webhook carries the reason. (The sensor runs
    in the code server: after a host loss it ticks again only once the new code is up.)"""
    job = durable_jobs.owning(run.job_name) if durable_jobs is not None else None
    batch_id = run.tags.get(BATCH_TAG)
    if job is None or not batch_id or run.status != DagsterRunStatus.FAILURE:
        return
    lineage = batch_runs(instance, batch_id)
    if lineage and lineage[-1].run_id == run.run_id:
        changes_only_a_person_may_cross(
            DurableDatabase.for_instance(instance), batch_id, job, lineage, steps_to_run(instance, lineage)
        )


def _on_run_end(context: RunStatusSensorContext, durable_jobs: DurableJobs | None) -> None:
    config = settings()
    if config is None:
        return
    note_code_changed(context.instance, context.dagster_run, durable_jobs)
    event, why = enqueue(context.instance, config, context.dagster_run.run_id)
    if event is None:
        context.log.info(f"no webhook: {why}")
        return
    report = deliverer(context.instance, config).flush(batch_id=event.batch_id)
    context.log.info(f"webhooks for {event.event_type} of batch {event.batch_id}: {report.summary()}")


def webhook_sensors(durable_jobs: DurableJobs | None = None) -> list[SensorDefinition]:
    """Run-status sensors for every job of this code location, and the outbox's retry sensor.

    Running by default so that a daemon delivers without anyone switching them on in the UI; they
    do nothing while ``DURABLE_WEBHOOK_URLS`` is unset. Runs executed by the CLI carry no code
    location origin and are not seen here: the CLI sends their events itself.
    """

    def on_run_end(context: RunStatusSensorContext) -> None:
        _on_run_end(context, durable_jobs)

    sensors: list[SensorDefinition] = [
        run_status_sensor(
            run_status=status,
            name=f"{event.replace('.', '_')}_webhooks",
            description=f"Enqueues and sends {event} when a batch's newest run ends {status.value}.",
            default_status=DefaultSensorStatus.RUNNING,
            minimum_interval_seconds=5,  # cheap (reads new run-status events only); bounds the delay
        )(on_run_end)
        for status, event in EVENT_TYPES.items()
    ]

    @sensor(
        name="webhook_outbox",
        minimum_interval_seconds=30,
        default_status=DefaultSensorStatus.RUNNING,
        description="Retries pending webhook deliveries (backoff, Retry-After) left by any process.",
    )
    def webhook_outbox(context: SensorEvaluationContext) -> Any:
        config = settings()
        if config is None:
            return SkipReason("DURABLE_WEBHOOK_URLS is not set")
        report = deliverer(context.instance, config).flush()
        return SkipReason(f"webhook outbox: {report.summary()}")

    return [*sensors, webhook_outbox]
