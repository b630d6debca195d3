"""A batch lease still held by a run Dagster recorded as ended is taken over at once.

Why: a daemon-launched worker never releases its lease, so "Re-execute from failure" in the UI
right after a failure would otherwise be refused until the lease's TTL ran out.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from dagster import DagsterInstance, DagsterRun, DagsterRunStatus

from durable_assets.errors import LeaseHeldError
from durable_assets.kit.db import DurableDatabase
from durable_assets.kit.leases import LeaseStore, acquire_unless_live_run
from durable_assets.kit.resources import run_ended


def _held_by(instance: DagsterInstance, status: DagsterRunStatus) -> LeaseStore:
    instance.add_run(DagsterRun(job_name="refund_batch", run_id="old-run", status=status))
    store = LeaseStore(DurableDatabase.for_instance(instance), ttl_s=60)
    store.acquire("b", "old-run", owner="host:1")
    return store


@pytest.mark.parametrize(
    "status", [DagsterRunStatus.FAILURE, DagsterRunStatus.CANCELED, DagsterRunStatus.SUCCESS]
)
def test_lease_of_an_ended_run_is_taken_over_with_a_new_fence(
    dagster_home: Path, status: DagsterRunStatus
) -> None:
    with DagsterInstance.get() as instance:
        store = _held_by(instance, status)
        old = store.get("b")
        assert old is not None and old.is_live()
        lease = acquire_unless_live_run(store, "b", "new-run", run_ended(instance))
        assert lease.run_id == "new-run" and lease.fence == old.fence + 1


def test_lease_of_a_running_run_is_still_refused(dagster_home: Path) -> None:
    with DagsterInstance.get() as instance:
        store = _held_by(instance, DagsterRunStatus.STARTED)
        with pytest.raises(LeaseHeldError):
            acquire_unless_live_run(store, "b", "new-run", run_ended(instance))
        current = store.get("b")
        assert current is not None and current.run_id == "old-run"
