"""Step leases: whether the task running a step of a distributed run is alive, and current.

A Celery task can vanish without a result (its worker SIGKILLed, frozen, cut off). The task renews
a ``durable_step_leases`` row for its (run, step) every TTL/3; the orchestrator re-sends a step
whose row lapsed, as a new *attempt*. A newer execution of a step supersedes an older one: the
older stops before its next provider request. No Celery here, so the step's resources can check
the lease without loading it. Expiry is written and judged on the database's clock (as for run
leases, kit/leases.py): a worker whose clock is off neither looks dead early nor lives on too long.
"""

from __future__ import annotations

import contextvars
import os
import sys
import threading
from dataclasses import dataclass, field

import sqlalchemy as sa

from durable_assets.kit.db import DurableDatabase, step_leases


@dataclass(frozen=True)
class StepLease:
    run_id: str
    step_key: str
    attempt: int
    owner: str
    expires_at: float
    finished: bool
    #: The database's clock when the row was read: the time ``expires_at`` is judged at.
    read_at: float

    @property
    def lapsed(self) -> bool:
        """Not renewed in time: the execution that holds it is presumed lost."""
        return self.expires_at <= self.read_at


class StepLeaseStore:
    """The ``durable_step_leases`` rows: which execution of a step is current, and whether it lives."""

    def __init__(self, db: DurableDatabase, ttl_s: float) -> None:
        self.db = db
        self.ttl_s = ttl_s

    def acquire(self, run_id: str, step_key: str, batch_id: str, attempt: int, owner: str) -> bool:
        """Take the step for this execution, unless a newer send of it exists or this send finished.

        A newer attempt always wins (the orchestrator judged the older one lost); the same attempt
        again is the broker's redelivery of a task whose worker it judged lost, and takes over.
        """
        c = step_leases.c
        with self.db.transaction() as conn:
            # The row's lock on Postgres; SQLite renders no FOR UPDATE (its BEGIN IMMEDIATE holds the file).
            query = sa.select(step_leases).where(c.run_id == run_id, c.step_key == step_key).with_for_update()
            row = conn.execute(query).first()
            t = self.db.clock(conn)
            values = {
                "run_id": run_id,
                "step_key": step_key,
                "batch_id": batch_id,
                "attempt": attempt,
                "owner": owner,
                "heartbeat_at": t,
                "expires_at": t + self.ttl_s,
                "finished": False,
            }
            if row is None:
                conn.execute(step_leases.insert().values(**values))
                return True
            if row.attempt > attempt or (row.attempt == attempt and row.finished):
                return False
            conn.execute(
                step_leases.update().where(c.run_id == run_id, c.step_key == step_key).values(**values)
            )
            return True

    def renew(self, run_id: str, step_key: str, owner: str) -> bool:
        c = step_leases.c
        with self.db.transaction() as conn:
            t = self.db.clock(conn)
            updated = conn.execute(
                step_leases.update()
                .where(c.run_id == run_id, c.step_key == step_key, c.owner == owner, c.finished.is_(False))
                .values(heartbeat_at=t, expires_at=t + self.ttl_s)
            ).rowcount
        return bool(updated)

    def finish(self, run_id: str, step_key: str, owner: str) -> None:
        c = step_leases.c
        with self.db.transaction() as conn:
            conn.execute(
                step_leases.update()
                .where(c.run_id == run_id, c.step_key == step_key, c.owner == owner)
                .values(finished=True, expires_at=self.db.clock(conn))
            )

    def of_run(self, run_id: str) -> dict[str, StepLease]:
        c = step_leases.c
        with self.db.read() as conn:
            rows = conn.execute(
                sa.select(step_leases, self.db.clock_column()).where(c.run_id == run_id)
            ).all()
        return {
            r.step_key: StepLease(
                r.run_id, r.step_key, r.attempt, r.owner, r.expires_at, bool(r.finished), r.db_now
            )
            for r in rows
        }


@dataclass
class TaskContext:
    """The step execution a task runs now, seen by ``BatchRuntime`` before every provider request."""

    run_id: str
    step_key: str
    owner: str
    store: StepLeaseStore
    lost: threading.Event = field(default_factory=threading.Event)

    def still_current(self, step_owner: str | None) -> bool:
        """False once a newer execution of this step took it over (this one must send nothing more),
        given who holds the step's lease, as read with the batch's standing (kit/standing.py)."""
        return not self.lost.is_set() and step_owner == self.owner

    def stand_down_if_superseded(self, step_owner: str | None) -> None:
        """Before a provider request: a superseded execution (a frozen worker that woke up after its
        step was sent again) ends its process at once, without a word in the run's event log.

        Raising would make Dagster record a failure of a step that the current execution completes;
        the pool child's exit instead looks to Celery like a lost worker, whose stale message the
        broker's redelivery then finds revoked or superseded.
        """
        if not self.still_current(step_owner):
            sys.stderr.write(
                f"durable-assets: step {self.step_key} of run {self.run_id} was taken over by a newer "
                "execution; this one stops before sending anything more\n"
            )
            sys.stderr.flush()
            os._exit(0)


#: Set by the task around its step; BatchRuntime captures it when the step's resources are built.
current_task: contextvars.ContextVar[TaskContext | None] = contextvars.ContextVar(
    "durable_task", default=None
)


class StepHeartbeat:
    def __init__(self, task: TaskContext) -> None:
        self.task = task
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"step-lease-{task.step_key}", daemon=True)

    def __enter__(self) -> StepHeartbeat:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=5)

    def _run(self) -> None:
        interval = max(self.task.store.ttl_s / 3.0, 0.2)
        while not self._stop.wait(interval):
            try:
                if not self.task.store.renew(self.task.run_id, self.task.step_key, self.task.owner):
                    self.task.lost.set()
                    return
            except Exception:  # a database hiccup: next beat; the TTL is the safety net
                continue
