"""May this worker still send? The batch's cancel request and its lease, read in one statement.

A worker asks before every side effect (:meth:`BatchRuntime.check_may_continue`), so thousands of
times a batch. As two SQLAlchemy reads (:class:`CancelStore`, :meth:`LeaseStore.check_fence`) that
cost ~0.55 ms of CPU per effect on SQLite, almost all of it SQLAlchemy's per-statement work and not
the queries; one prebuilt statement handed to the driver asks both questions for a fraction of it.
The answers and their errors are the same as the two stores'.
"""

from __future__ import annotations

from dataclasses import dataclass

import sqlalchemy as sa

from durable_assets.errors import FencedOutError
from durable_assets.kit.cancel import canceled_error
from durable_assets.kit.crashpoints import CrashPoint, crash_point
from durable_assets.kit.db import DurableDatabase, cancel_requests, driver_params, leases
from durable_assets.kit.leases import fenced_out_error


@dataclass(frozen=True)
class Standing:
    canceled: bool
    run_id: str | None  # the lease's holder; None when the batch has no lease row
    fence: int | None


_BATCH: sa.BindParameter[str] = sa.bindparam("batch_id")
_STANDING = sa.select(
    sa.exists().where(cancel_requests.c.batch_id == _BATCH).label("canceled"),
    sa.select(leases.c.run_id).where(leases.c.batch_id == _BATCH).scalar_subquery().label("run_id"),
    sa.select(leases.c.fence).where(leases.c.batch_id == _BATCH).scalar_subquery().label("fence"),
)


def read_standing(db: DurableDatabase, batch_id: str) -> Standing:
    with db.read() as conn:
        sql, params = driver_params(conn, _STANDING, {"batch_id": batch_id})
        canceled, run_id, fence = conn.exec_driver_sql(sql, params).one()
    return Standing(bool(canceled), run_id, None if fence is None else int(fence))


def raise_unless_may_send(db: DurableDatabase, batch_id: str, fence: int, run_id: str | None = None) -> None:
    """Raise if the batch was canceled, or taken over by a newer fence, or (``run_id`` given, for a
    distributed task) is now run by another run; the cancel is judged first, as by the stores."""
    standing = read_standing(db, batch_id)
    if standing.canceled:
        raise canceled_error(batch_id)
    crash_point(CrashPoint.AFTER_CANCEL_CHECK)
    if standing.fence != fence:
        raise fenced_out_error(batch_id, standing.run_id, standing.fence, fence)
    if run_id is not None and standing.run_id != run_id:
        raise FencedOutError(
            f"batch {batch_id!r} is now run by {standing.run_id}; "
            f"this task of run {run_id} stops before sending anything more"
        )
