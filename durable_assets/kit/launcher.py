"""A run launcher whose worker health check reads the batch lease.

Dagster's ``DefaultRunLauncher`` cannot tell whether a run's worker process is alive, so run
monitoring cannot fail runs whose worker was SIGKILLed; they stay STARTED forever. This launcher
launches exactly like the default one and answers ``check_run_worker_health`` from the lease the
worker renews in the instance's database, which works whatever host the worker ran on. With
``run_retries`` enabled (strategy FROM_FAILURE) the daemon then re-executes the run automatically.
"""

from __future__ import annotations

from dagster import DagsterRun
from dagster._core.launcher import CheckRunHealthResult, DefaultRunLauncher, WorkerStatus

from durable_assets.kit.db import DurableDatabase, now
from durable_assets.kit.leases import Lease, LeaseStore
from durable_assets.kit.resources import BATCH_TAG


class LeaseAwareRunLauncher(DefaultRunLauncher):
    @property
    def supports_check_run_worker_health(self) -> bool:
        return True

    def check_run_worker_health(self, run: DagsterRun) -> CheckRunHealthResult:
        batch_id = run.tags.get(BATCH_TAG) or run.tags.get("dagster/partition") or ""
        lease = LeaseStore(DurableDatabase.for_instance(self._instance)).get(batch_id) if batch_id else None
        record = self._instance.get_run_record_by_id(run.run_id)
        started_at = record.start_time if record is not None else None
        return health_from_lease(run.run_id, lease, started_at, now())


#: How long a started run may go without taking its lease (process start, code loading).
STARTUP_GRACE_S = 60.0


def health_from_lease(
    run_id: str, lease: Lease | None, started_at: float | None, at: float
) -> CheckRunHealthResult:
    """Pure, so testable without a daemon. Anything but RUNNING/SUCCESS makes monitoring fail the run."""
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
