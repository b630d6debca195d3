"""Resume without a human: the daemon re-executes batches whose worker was lost and not retried.

Run monitoring fails a run whose worker stopped renewing its lease and tags it
``durable/worker_lost``; Dagster's run retries then re-execute it from failure. That retry needs the
run's code location at that moment: when the worker's host died with its code server, the retry
daemon drops the retry (``DagsterUserCodeUnreachableError``, ``dagster/will_retry=false``) and the
batch would stay failed until someone runs `job resume`.

The ``auto_resume_lost_batches`` sensor closes that gap. It runs in the code server, so it ticks
again as soon as the code location is back, and each tick:

1. finds batches whose newest run FAILED with ``durable/worker_lost``, ended more than
   ``after_s`` ago (Dagster's own retry had its chance) and has no child run;
2. takes the batch's lease (the takeover rule of `job resume` and of every worker), so it never
   races a `job resume` or a live worker: whoever holds the lease owns the batch, the other backs
   off and sees the newer run on its next look;
3. under the lease, re-reads the lineage and creates the same re-execution from failure that
   `job resume` runs (``reexecution.create_from_failure_run``), with a run id derived from the lost
   run (a second tick, or a second daemon, collides on it instead of starting a second resume), and
   submits it to the run queue;
4. tags both runs: the new one with ``durable/auto_resume_attempt`` (of
   ``durable/auto_resume_max_attempts``), the lost one with ``durable/auto_resumed_by``.

At most ``max_attempts`` automatic resumes per batch (a host that dies on every attempt must not
loop forever); after that the batch stays failed, says why in its run's tags and events, and waits
for a human. A batch with a cancel request is never resumed automatically.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from datetime import UTC, datetime

from dagster import (
    DagsterInstance,
    DagsterRun,
    DagsterRunStatus,
    DefaultSensorStatus,
    JobDefinition,
    QueuedRunCoordinator,
    RunsFilter,
    SensorDefinition,
    SensorEvaluationContext,
    SkipReason,
    sensor,
)

from durable_assets.errors import LeaseHeldError
from durable_assets.kit import DurableJob, DurableJobs
from durable_assets.kit.runtime import (
    AUTO_RESUME_ATTEMPT_TAG,
    AUTO_RESUME_MAX_TAG,
    AUTO_RESUME_OF_TAG,
    AUTO_RESUMED_BY_TAG,
    AUTO_RETRY_RUN_ID_TAG,
    BATCH_TAG,
    FAILURE_REASON_TAG,
    PARENT_RUN_ID_TAG,
    PENDING_RUN,
    RESUME_RETRY_TAG,
    RETRY_NUMBER_TAG,
    ROOT_RUN_ID_TAG,
    RUN_METRICS_TAG,
    SHARDS_TAG,
    WILL_RETRY_TAG,
    WORKER_LOST_TAG,
    CancelStore,
    DurableDatabase,
    LeaseStore,
    acquire_unless_live_run,
    now,
    process_owner,
    refusal,
    run_ended,
    worker_lost_reason,
)
from durable_assets.ops.code_changes import changes_only_a_person_may_cross
from durable_assets.ops.reexecution import (
    all_steps_committed,
    create_from_failure_run,
    record_run_success,
)
from durable_assets.ops.settings import AutoResumeSettings
from durable_assets.ops.status import batch_runs, steps_to_run
from durable_assets.ops.webhooks.batch import announce_end

SENSOR_NAME = "auto_resume_lost_batches"
#: Tags a re-execution must not inherit from the run it continues (Dagster's retry bookkeeping,
#: and our own per-run verdicts).
_NOT_INHERITED_PREFIXES = (WILL_RETRY_TAG, RETRY_NUMBER_TAG, FAILURE_REASON_TAG)
_NOT_INHERITED = {
    WORKER_LOST_TAG,
    AUTO_RESUMED_BY_TAG,
    AUTO_RESUME_ATTEMPT_TAG,
    AUTO_RESUME_MAX_TAG,
    AUTO_RESUME_OF_TAG,
    AUTO_RETRY_RUN_ID_TAG,
    PARENT_RUN_ID_TAG,
    ROOT_RUN_ID_TAG,
    RESUME_RETRY_TAG,
    RUN_METRICS_TAG,
}
#: How a ``durable/auto_resumed_by`` verdict not to resume begins (the others name the resume's run).
_DECLINED = "none:"
#: Lost runs older than this are left to a human: after a day, resuming is an operator's decision.
LOOKBACK_S = 24 * 3600.0
#: The run id of an automatic resume is derived from the run it continues: one per lost run, ever.
_RUN_ID_NAMESPACE = uuid.UUID("6f1c2a5e-8d4b-4c1e-9a7f-3b2d1e0c9f11")


def resume_run_id(lost_run_id: str) -> str:
    return str(uuid.uuid5(_RUN_ID_NAMESPACE, f"auto-resume:{lost_run_id}"))


def resume_lost_batches(
    instance: DagsterInstance,
    job_named: Callable[[str], JobDefinition | None],
    settings: AutoResumeSettings,
    at: float | None = None,
    durable_jobs: DurableJobs | None = None,
) -> list[str]:
    """One tick: resume every lost batch that is due; returns one line per decision."""
    at = now() if at is None else at
    lines = [_submit(instance, run) for run in _created_not_submitted(instance, settings, at)]
    for run in _lost_runs(instance, at):
        record = instance.get_run_record_by_id(run.run_id)
        if record is None or record.end_time is None or at - record.end_time < settings.after_s:
            continue  # Dagster's own run retry still has its chance
        job = job_named(run.job_name)
        if job is None:
            continue  # another code location's job: its own sensor resumes it
        durable = durable_jobs.owning(run.job_name) if durable_jobs is not None else None
        line = resume_lost_run(instance, job, run, settings, durable)
        if line:
            lines.append(line + _announce_if_declined(instance, run))
    return lines


def _lost_runs(instance: DagsterInstance, at: float) -> list[DagsterRun]:
    since = datetime.fromtimestamp(at - LOOKBACK_S, tz=UTC)
    failed = instance.get_runs(RunsFilter(statuses=[DagsterRunStatus.FAILURE], updated_after=since))
    return [
        r
        for r in failed
        if worker_lost_reason(r.tags) and BATCH_TAG in r.tags and AUTO_RESUMED_BY_TAG not in r.tags
    ]


def _created_not_submitted(
    instance: DagsterInstance, settings: AutoResumeSettings, at: float
) -> list[DagsterRun]:
    """Resumes a previous tick created but did not live to submit (the code server died in between)."""
    stuck = instance.get_runs(RunsFilter(statuses=[DagsterRunStatus.NOT_STARTED]))
    out = []
    for run in stuck:
        record = instance.get_run_record_by_id(run.run_id)
        old = record is not None and at - record.create_timestamp.timestamp() > settings.interval_s
        if AUTO_RESUME_ATTEMPT_TAG in run.tags and old:
            out.append(run)
    return out


def _submit(instance: DagsterInstance, run: DagsterRun) -> str:
    # The queued run coordinator only records the enqueue; the daemon's run queue launches it with
    # its own workspace, so no workspace is needed (or available) here.
    instance.submit_run(run.run_id, workspace=None)  # type: ignore[arg-type]
    return f"batch {run.tags.get(BATCH_TAG)!r}: submitted automatic resume run {run.run_id}"


def resume_lost_run(
    instance: DagsterInstance,
    job: JobDefinition,
    lost: DagsterRun,
    settings: AutoResumeSettings,
    durable: DurableJob | None = None,
) -> str | None:
    """Resume one lost run's batch, or say why not (None: someone else continued it, nothing to
    say); at most one resume per lost run, ever. Never across a code change only a person may
    cross (``durable``: the job's descriptor, whose deployed code is compared with the batch's)."""
    batch_id = lost.tags[BATCH_TAG]
    lineage = batch_runs(instance, batch_id)
    if lineage[-1].run_id != lost.run_id or instance.get_runs(
        RunsFilter(tags={PARENT_RUN_ID_TAG: lost.run_id}), limit=1
    ):
        ours = resume_run_id(lost.run_id)
        if instance.get_run_by_id(ours) is not None:  # a tick that died before tagging the lost run
            instance.add_run_tags(lost.run_id, {AUTO_RESUMED_BY_TAG: ours, AUTO_RETRY_RUN_ID_TAG: ours})
        return None  # a Dagster retry, a `job resume` or the UI continued it
    db = DurableDatabase.for_instance(instance)
    if CancelStore(db).is_requested(batch_id):
        return _decide(instance, lost, "none: a cancel was requested", "a cancel is requested; not resuming")
    if SHARDS_TAG in lost.tags:
        # A sharded batch's steps are its sharded job's, which only `job resume` rebuilds (the code
        # location serves the job as the UI shows it); resuming it here would run another plan. A
        # batch launched distributed from the UI or a schedule is the location's job: it is resumed
        # below, on the workers again (the re-execution keeps its run config and executor tag).
        return _decide(
            instance,
            lost,
            "none: a sharded batch",
            f"a sharded batch (`job run --executor celery --shards N`); "
            f"`job resume --id {batch_id}` continues it",
        )
    attempt = 1 + max((_attempt(r) for r in lineage), default=0)
    if attempt > settings.max_attempts:
        return _decide(
            instance,
            lost,
            f"none: {settings.max_attempts} automatic resumes spent",
            f"{settings.max_attempts} automatic resumes spent; `job resume --id {batch_id}` continues it",
        )
    leases = LeaseStore(db, ttl_s=settings.lease_ttl_s)
    new_run_id = resume_run_id(lost.run_id)
    owner = f"auto-resume@{process_owner()}/{uuid.uuid4().hex[:8]}"
    try:
        # Held by no run ("pending", as `job resume` holds it before its run exists): the run we
        # create takes it when its worker starts, and until then nobody may take the queued run for dead.
        lease = acquire_unless_live_run(leases, batch_id, PENDING_RUN, run_ended(instance), owner=owner)
    except LeaseHeldError as exc:
        return f"batch {batch_id!r}: not resuming, someone else holds it ({exc})"
    try:
        lineage = batch_runs(instance, batch_id)  # re-read under the lease: what did we win?
        if lineage[-1].run_id != lost.run_id:
            return f"batch {batch_id!r}: run {lineage[-1].run_id} continued it first"
        if all_steps_committed(instance, lineage):
            record_run_success(instance, lost, batch_id, by="the daemon's automatic resume")
            return _decide(instance, lost, "none: every step had committed", "every step had committed")
        stopping = (
            changes_only_a_person_may_cross(db, batch_id, durable, lineage, steps_to_run(instance, lineage))
            if durable is not None
            else []
        )
        if stopping:
            return _decide(
                instance,
                lost,
                "none: code changed since the batch started",
                f"code changed since the batch started: {refusal(batch_id, stopping)}",
            )
        tags = {k: v for k, v in lost.tags.items() if _inherited(k)}
        tags |= {
            AUTO_RESUME_ATTEMPT_TAG: str(attempt),
            AUTO_RESUME_MAX_TAG: str(settings.max_attempts),
            AUTO_RESUME_OF_TAG: lost.run_id,
        }
        new = instance.get_run_by_id(new_run_id) or create_from_failure_run(
            instance, job, lost, run_id=new_run_id, tags=tags
        )
        instance.add_run_tags(
            lost.run_id, {AUTO_RESUMED_BY_TAG: new.run_id, AUTO_RETRY_RUN_ID_TAG: new.run_id}
        )
        what = f"automatic resume, attempt {attempt} of {settings.max_attempts}"
        instance.report_engine_event(
            f"durable-assets: worker lost and not retried; {what}: run {new.run_id}", lost
        )
        instance.report_engine_event(f"durable-assets: {what} of run {lost.run_id} (batch {batch_id!r})", new)
        if new.status == DagsterRunStatus.NOT_STARTED:
            _submit(instance, new)
        return f"batch {batch_id!r}: {what} as run {new.run_id}"
    finally:
        # The new run's worker takes the lease itself when it starts (a new fence); until then a
        # `job resume` sees the queued run as the batch's newest and refuses to start a second one.
        leases.release(lease)


def _attempt(run: DagsterRun) -> int:
    try:
        return int(run.tags.get(AUTO_RESUME_ATTEMPT_TAG, 0))
    except ValueError:
        return 0


def _inherited(key: str) -> bool:
    return key not in _NOT_INHERITED and not key.startswith(_NOT_INHERITED_PREFIXES)


def _decide(instance: DagsterInstance, lost: DagsterRun, verdict: str, why: str) -> str:
    """Record (once) that this lost run will not be resumed automatically, and why."""
    instance.add_run_tags(lost.run_id, {AUTO_RESUMED_BY_TAG: verdict})
    instance.report_engine_event(f"durable-assets: not resumed automatically: {why}", lost)
    return f"batch {lost.tags[BATCH_TAG]!r}: not resumed automatically: {why}"


def _announce_if_declined(instance: DagsterInstance, lost: DagsterRun) -> str:
    """After a decision not to resume (and once our lease is released, or the failure would read
    as a takeover): the lost run is the batch's end after all, and its failure's webhook waited for
    this decision (ops/webhooks/batch.py)."""
    run = instance.get_run_by_id(lost.run_id)
    if run is None or not run.tags.get(AUTO_RESUMED_BY_TAG, "").startswith(_DECLINED):
        return ""
    try:
        return f" ({announce_end(instance, lost.run_id)})"
    except Exception as exc:  # a webhook problem must not undo the decision; the outbox sensor retries
        return f" (webhooks: {type(exc).__name__}: {exc})"


def auto_resume_sensor(
    settings: AutoResumeSettings, durable_jobs: DurableJobs | None = None
) -> SensorDefinition:
    """The daemon-side `job resume` for lost workers; running by default, off with max attempts 0.
    ``durable_jobs`` (the location's) judge whether the deployed code may continue a batch."""

    @sensor(
        name=SENSOR_NAME,
        minimum_interval_seconds=settings.interval_s,
        default_status=DefaultSensorStatus.RUNNING,
        description=(
            "Re-executes from failure a batch whose worker was lost and that Dagster's run retries did "
            f"not pick up within {settings.after_s:.0f} s (code location unreachable), at most "
            f"{settings.max_attempts} times per batch (DURABLE_AUTO_RESUME_MAX_ATTEMPTS)."
        ),
    )
    def auto_resume_lost_batches(context: SensorEvaluationContext) -> SkipReason:
        if settings.max_attempts <= 0:
            return SkipReason("automatic resume is off (DURABLE_AUTO_RESUME_MAX_ATTEMPTS=0)")
        if not isinstance(context.instance.run_coordinator, QueuedRunCoordinator):
            return SkipReason("automatic resume needs the queued run coordinator (Dagster's default)")
        repo = context.repository_def

        def job_named(name: str) -> JobDefinition | None:
            return repo.get_job(name) if repo is not None and repo.has_job(name) else None

        lines = resume_lost_batches(context.instance, job_named, settings, durable_jobs=durable_jobs)
        for line in lines:
            context.log.info(line)
        # The runs it starts are re-executions, not sensor runs: the tick says what it did.
        return SkipReason("; ".join(lines) or "no lost batch to resume")

    return auto_resume_lost_batches
