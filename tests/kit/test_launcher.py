"""Run monitoring's view of a worker, decided from its lease (pure function)."""

from __future__ import annotations

from dagster._core.launcher import WorkerStatus

from durable_assets.kit.launcher import STARTUP_GRACE_S, health_from_lease
from durable_assets.kit.leases import Lease


def _lease(run_id: str, expires_at: float, released: bool = False) -> Lease:
    return Lease("b", run_id, "host:1", 1, expires_at, released)


def test_live_lease_is_running_and_expired_lease_is_failed() -> None:
    assert health_from_lease("r", _lease("r", 110), 0, 100).status == WorkerStatus.RUNNING
    failed = health_from_lease("r", _lease("r", 90), 0, 100)
    assert failed.status == WorkerStatus.FAILED and "host:1" in (failed.msg or "")
    assert health_from_lease("r", _lease("r", 110, released=True), 0, 100).status == WorkerStatus.FAILED


def test_a_starting_run_gets_a_grace_period_then_fails_without_a_lease() -> None:
    assert health_from_lease("r", None, 100, 101).status == WorkerStatus.RUNNING
    assert health_from_lease("r", None, 100, 100 + STARTUP_GRACE_S + 1).status == WorkerStatus.FAILED
    # Another run took the batch over: this one is an orphan.
    late = health_from_lease("r", _lease("other", 1e12), 0, STARTUP_GRACE_S + 1)
    assert late.status == WorkerStatus.FAILED and "other" in (late.msg or "")


def test_a_run_that_is_no_batch_is_never_failed_for_want_of_a_lease() -> None:
    """The retention job takes no lease; monitoring must not fail it after the grace period."""
    from dagster import DagsterRun

    from durable_assets.kit.launcher import LeaseAwareRunLauncher

    run = DagsterRun(job_name="retention", run_id="r-1", tags={})
    assert LeaseAwareRunLauncher().check_run_worker_health(run).status == WorkerStatus.RUNNING


def test_a_retry_that_inherited_a_lost_workers_tag_starts_not_lost(dagster_home: object) -> None:
    """Dagster's run retry copies the lost run's tags; the launcher clears the verdict before the
    retry starts, so it is not counted as a lease expiry, nor read as lost once it succeeded (#35)."""
    from dagster import DagsterInstance, DagsterRun

    from durable_assets.kit.launcher import clear_inherited_verdicts
    from durable_assets.kit.tags import WORKER_LOST_LEASE_EXPIRED, WORKER_LOST_TAG, worker_lost_reason

    with DagsterInstance.get() as instance:
        lost = instance.add_run(
            DagsterRun(job_name="refund_batch", tags={WORKER_LOST_TAG: WORKER_LOST_LEASE_EXPIRED})
        )
        clear_inherited_verdicts(instance, lost)
        run = instance.get_run_by_id(lost.run_id)
        assert run is not None and worker_lost_reason(run.tags) is None
        assert worker_lost_reason({WORKER_LOST_TAG: WORKER_LOST_LEASE_EXPIRED}) == WORKER_LOST_LEASE_EXPIRED
