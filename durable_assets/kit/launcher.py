"""A run launcher whose worker health check reads the batch lease.

Dagster's ``DefaultRunLauncher`` cannot tell whether a run's worker process is alive, so run
monitoring cannot fail runs whose worker was SIGKILLed; they stay STARTED forever. This launcher
launches exactly like the default one and answers ``check_run_worker_health`` from the lease the
worker renews in the instance's database, which works whatever host the worker ran on. With
``run_retries`` enabled (strategy FROM_FAILURE) the daemon then re-executes the run automatically.

It also makes runs launched from the UI, a schedule or a sensor look like CLI batches: a run of a
partitioned job gets the ``durable/batch`` tag from its partition before its worker starts, and the
UI's Terminate button records a cooperative cancel first, so no refund is sent after it. A run
whose config selects the celery executor is tagged ``durable/executor=celery`` before it starts.
"""

from __future__ import annotations

from dagster import DagsterInstance, DagsterRun, DefaultRunLauncher

from durable_assets.kit.cancel import CancelStore
from durable_assets.kit.dagster_internals import CheckRunHealthResult, LaunchRunContext, WorkerStatus
from durable_assets.kit.db import DurableDatabase, now
from durable_assets.kit.executor import selects_celery
from durable_assets.kit.leases import Lease, LeaseStore
from durable_assets.kit.modes import ExecutorKind
from durable_assets.kit.tags import (
    BATCH_TAG,
    EXECUTOR_TAG,
    PARTITION_TAG,
    WORKER_LOST_LEASE_EXPIRED,
    WORKER_LOST_TAG,
    WORKER_NOT_LOST,
    worker_lost_reason,
)


def batch_of(run: DagsterRun) -> str | None:
    return run.tags.get(BATCH_TAG) or run.tags.get(PARTITION_TAG) or None


def clear_inherited_verdicts(instance: DagsterInstance, run: DagsterRun) -> None:
    """A run about to start has not lost its worker: a ``durable/worker_lost`` it carries was copied
    from the run it retries (Dagster's run retries copy the parent's tags), and would count it in
    ``durable_lease_expiries_total`` and read as lost in its status once it succeeded."""
    if worker_lost_reason(run.tags):
        instance.add_run_tags(run.run_id, {WORKER_LOST_TAG: WORKER_NOT_LOST})


class LeaseAwareRunLauncher(DefaultRunLauncher):
    def launch_run(self, context: LaunchRunContext) -> None:
        run = context.dagster_run
        partition = run.tags.get(PARTITION_TAG)
        if partition and BATCH_TAG not in run.tags:
            # The worker reloads the run from storage, so it (and `job status`) sees the tag.
            self._instance.add_run_tags(run.run_id, {BATCH_TAG: partition})
        if selects_celery(run.run_config) and EXECUTOR_TAG not in run.tags:
            # The launchpad chose the workers by config: tagged now, so `job resume` and the status
            # read it as distributed even if the run worker dies before its executor starts.
            self._instance.add_run_tags(run.run_id, {EXECUTOR_TAG: ExecutorKind.CELERY.value})
        clear_inherited_verdicts(self._instance, run)
        super().launch_run(context)

    def terminate(self, run_id: str) -> bool:
        run = self._instance.get_run_by_id(run_id)
        batch_id = batch_of(run) if run is not None else None
        if batch_id and run is not None and not run.is_finished:
            CancelStore(DurableDatabase.for_instance(self._instance)).request(batch_id)
        return bool(super().terminate(run_id))

    @property
    def supports_check_run_worker_health(self) -> bool:
        return True

    def check_run_worker_health(self, run: DagsterRun) -> CheckRunHealthResult:
        batch_id = batch_of(run)
        if not batch_id:
            # Not a batch (e.g. the retention job): its worker takes no lease, so we cannot tell,
            # and must not fail it. This is what the default launcher amounts to.
            return CheckRunHealthResult(WorkerStatus.RUNNING, "not a batch run; no lease to check")
        lease = LeaseStore(DurableDatabase.for_instance(self._instance)).get(batch_id)
        record = self._instance.get_run_record_by_id(run.run_id)
        started_at = record.start_time if record is not None else None
        # A lease is judged on the database's clock, read with it; only a batch without one is judged
        # on ours (the start time is Dagster's record, written on some worker's clock anyway).
        health = health_from_lease(
            run.run_id, lease, started_at, lease.db_now if lease is not None else now()
        )
        if health.status == WorkerStatus.FAILED:
            # Monitoring fails the run right after this answer; the tag says why, for metrics.
            self._instance.add_run_tags(run.run_id, {WORKER_LOST_TAG: WORKER_LOST_LEASE_EXPIRED})
        return health

    def get_run_worker_debug_info(self, run: DagsterRun, include_container_logs: bool | None = True) -> str:
        batch_id = batch_of(run)
        lease = LeaseStore(DurableDatabase.for_instance(self._instance)).get(batch_id) if batch_id else None
        if lease is None:
            return f"no lease recorded for batch {batch_id!r}"
        return (
            f"batch {batch_id!r} lease: run {lease.run_id}, owner {lease.owner}, fence {lease.fence}, "
            f"expired {-lease.seconds_left():.1f} s ago"
        )


#: How long a started run may go without taking its lease (process start, code loading).
STARTUP_GRACE_S = 60.0


def health_from_lease(
    run_id: str, lease: Lease | None, started_at: float | None, at: float
) -> CheckRunHealthResult:
    """Pure, so testable without a daemon. Anything but RUNNING/SUCCESS makes monitoring fail the run.

    ``at`` is the database's clock when the lease was read (``Lease.db_now``), the clock it was written on.
    """
    if lease is not None and lease.run_id == run_id:
        if lease.is_live(at):
            return CheckRunHealthResult(WorkerStatus.RUNNING, f"lease live for {lease.expires_at - at:.1f} s")
        return CheckRunHealthResult(
            WorkerStatus.FAILED,
            f"run worker {lease.owner} stopped renewing its lease {at - lease.expires_at:.1f} s ago; "
            "it is presumed dead",
        )
    if started_at is None or at - started_at < STARTUP_GRACE_S:
        return CheckRunHealthResult(WorkerStatus.RUNNING, "worker starting; lease not taken yet")
    holder = f"run {lease.run_id}" if lease is not None else "nobody"
    return CheckRunHealthResult(
        WorkerStatus.FAILED,
        f"the batch lease is held by {holder}, not this run, {at - started_at:.0f} s after it started",
    )
