"""Cooperative cancel that really stops side effects.

``report_run_canceling`` stops nothing in a plain Dagster process, so a cancel is a committed row
the worker reads between steps and before every chunk of side effects. Because the row commits
before the CLI/API answers, "no request after the cancel is recorded" is a checkable promise.
"""

from __future__ import annotations

import sqlalchemy as sa

from durable_assets.errors import BatchCanceledError
from durable_assets.kit.crashpoints import CrashPoint, crash_point
from durable_assets.kit.db import DurableDatabase, cancel_requests, now


class CancelStore:
    """Cancel requests by batch: the CLI and API write one, a running batch reads it and stops."""

    def __init__(self, db: DurableDatabase) -> None:
        self.db = db

    def request(self, batch_id: str) -> None:
        with self.db.transaction() as conn:
            conn.execute(
                self.db.insert_ignore(cancel_requests), [{"batch_id": batch_id, "requested_at": now()}]
            )

    def clear(self, batch_id: str) -> None:
        """A resume continues a canceled batch, so it withdraws the earlier request first."""
        with self.db.transaction() as conn:
            conn.execute(cancel_requests.delete().where(cancel_requests.c.batch_id == batch_id))

    def is_requested(self, batch_id: str) -> bool:
        with self.db.read() as conn:
            row = conn.execute(
                sa.select(cancel_requests.c.batch_id).where(cancel_requests.c.batch_id == batch_id)
            ).first()
        return row is not None

    def raise_if_requested(self, batch_id: str) -> None:
        if self.is_requested(batch_id):
            raise canceled_error(batch_id)
        crash_point(CrashPoint.AFTER_CANCEL_CHECK)


def canceled_error(batch_id: str) -> BatchCanceledError:
    return BatchCanceledError(
        f"batch {batch_id!r} was canceled; stopped before the next side effect. "
        f"`job resume --id {batch_id}` continues it."
    )
