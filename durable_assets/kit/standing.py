"""May this worker still send? The batch's cancel, its run's stop request and its lease, in one statement.

A worker asks before every side effect (:meth:`BatchRuntime.check_may_continue`), so thousands of
times a batch; a distributed task asks in the same statement whether its step is still its own
(its step lease). As SQLAlchemy reads (:class:`CancelStore`, :meth:`LeaseStore.check_fence`, the
step lease's) they cost ~0.55 ms of CPU per effect on SQLite, almost all of it SQLAlchemy's
per-statement work and not the queries, and a task took a pooled connection twice per effect; one
prebuilt statement handed to the driver asks every question for a fraction of it (11 us on
SQLite, :meth:`DurableDatabase.read_row`). The answers and their errors are the same as the stores'.
"""

from __future__ import annotations

from dataclasses import dataclass

import sqlalchemy as sa

from durable_assets.errors import FencedOutError
from durable_assets.kit.cancel import canceled_error
from durable_assets.kit.crashpoints import CrashPoint, crash_point
from durable_assets.kit.db import DurableDatabase, cancel_requests, leases, step_leases, stop_requests
from durable_assets.kit.interrupts import interrupted_error
from durable_assets.kit.leases import fenced_out_error


@dataclass(frozen=True)
class Standing:
    canceled: bool
    stop_signal: int | None  # the signal the process leading the asking run received, if any
    run_id: str | None  # the lease's holder; None when the batch has no lease row
    fence: int | None
    #: Who holds the asking task's step lease (a distributed run's step): the execution that may
    #: send for that step. None when no step was named, or it has no lease row.
    step_owner: str | None = None


_BATCH: sa.BindParameter[str] = sa.bindparam("batch_id")
_RUN: sa.BindParameter[str] = sa.bindparam("run_id")
_STEP: sa.BindParameter[str] = sa.bindparam("step_key")
_STANDING = sa.select(
    sa.exists().where(cancel_requests.c.batch_id == _BATCH).label("canceled"),
    sa.select(stop_requests.c.signal)
    .where(stop_requests.c.batch_id == _BATCH, stop_requests.c.run_id == _RUN)
    .scalar_subquery()
    .label("stop_signal"),
    sa.select(leases.c.run_id).where(leases.c.batch_id == _BATCH).scalar_subquery().label("run_id"),
    sa.select(leases.c.fence).where(leases.c.batch_id == _BATCH).scalar_subquery().label("fence"),
    sa.select(step_leases.c.owner)
    .where(step_leases.c.run_id == _RUN, step_leases.c.step_key == _STEP)
    .scalar_subquery()
    .label("step_owner"),
)


def read_standing(db: DurableDatabase, batch_id: str, run_id: str = "", step_key: str = "") -> Standing:
    """The batch's standing as run ``run_id`` sees it (its stop request; none for ``""``), and as
    its task running ``step_key`` does (that step's lease)."""
    found = db.read_row(_STANDING, {"batch_id": batch_id, "run_id": run_id, "step_key": step_key})
    assert found is not None  # a SELECT of scalar subqueries always answers one row
    canceled, stop_signal, holder, fence, step_owner = found
    return Standing(
        bool(canceled),
        None if stop_signal is None else int(stop_signal),
        holder,
        None if fence is None else int(fence),
        step_owner,
    )


def raise_unless_may_send(
    db: DurableDatabase, batch_id: str, fence: int, run_id: str | None = None, step_key: str = ""
) -> Standing:
    """Raise if the batch was canceled, or its run ``run_id`` (a distributed task's) was interrupted,
    or it was taken over by a newer fence, or is now run by another run; the cancel is judged first,
    as by the stores. Returns the standing read, whose ``step_owner`` (of ``step_key``) the task
    judges itself (:meth:`TaskContext.stand_down_if_superseded`)."""
    standing = read_standing(db, batch_id, run_id or "", step_key)
    if standing.canceled:
        raise canceled_error(batch_id)
    if standing.stop_signal is not None:
        raise interrupted_error(batch_id, standing.stop_signal)
    crash_point(CrashPoint.AFTER_CANCEL_CHECK)
    if standing.fence != fence:
        raise fenced_out_error(batch_id, standing.run_id, standing.fence, fence)
    if run_id is not None and standing.run_id != run_id:
        raise FencedOutError(
            f"batch {batch_id!r} is now run by {standing.run_id}; "
            f"this task of run {run_id} stops before sending anything more"
        )
    return standing
