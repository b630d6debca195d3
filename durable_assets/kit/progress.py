"""User-facing progress inside long steps, throttled so reporting never slows the work.

Each report that passes the throttle goes to two places: the ``durable_progress`` row (the latest
report per batch, what polling clients read) and the run's Dagster event log as an engine event.
The event log is where step starts, successes and run status changes already are, so a progress
report gets a storage id in the same sequence: a stream can interleave progress with step and
status events in their true order and resume after any of them. The UI shows the reports too.

A sharded step (kit/sharding.py) runs as N shards at once, on several workers. Each shard keeps its
own count (``durable_shard_progress``) and every report of one publishes the step's: ``of`` the sum
of the shards' ``of`` (a shard that has not counted its work yet counts its rows), ``done`` the sum
of their ``done``. The sum is written, and its event logged, under a lock on the batch's row, so
reports reach the row and the event log in the order they were summed, and one whose step fraction
would be lower than the last published for the same run and step is not published: what readers
see never goes back.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING

import sqlalchemy as sa

from durable_assets.kit.crashpoints import CrashPoint, crash_point
from durable_assets.kit.db import DurableDatabase, now, progress, shard_progress
from durable_assets.kit.tags import PROGRESS_METADATA_KEY

if TYPE_CHECKING:
    from dagster import DagsterEvent, DagsterInstance, DagsterRun

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Progress:
    step: int
    total: int
    label: str
    done: int
    of: int

    def as_dict(self) -> dict[str, int | str]:
        return asdict(self)

    @property
    def counted(self) -> bool:
        """Whether the report carries a count; ``of == 0`` means the step has nothing to count."""
        return self.of > 0

    def describe(self) -> str:
        """``step 4/7 Issuing refunds 450/1000``; no ``0/0`` for a step without a count."""
        text = f"step {self.step}/{self.total} {self.label}"
        return f"{text} {self.done}/{self.of}" if self.counted else text


@dataclass(frozen=True)
class ShardOf:
    """Where a report comes from when its step is sharded: shard ``k`` of ``n`` of ``step``.

    ``finished``: the shard's work is all done (its body returned), whatever it last counted.
    """

    step: str
    k: int
    n: int
    finished: bool = False


class ProgressStore:
    """Each step's done/of by batch, written as it works and read by `job status`, the API and the UI."""

    def __init__(self, db: DurableDatabase) -> None:
        self.db = db

    def expect_shards(self, batch_id: str, run_id: str, step: str, rows: Sequence[int]) -> None:
        """Each shard's row count as its ``of`` until it counts its own work: from a shard's start on,
        the step's ``of`` is its whole total, not the sum of the shards that happened to start."""
        t = now()
        values = [
            {"batch_id": batch_id, "step": step, "shards": len(rows), "shard": k, "run_id": run_id}
            | {"done": 0, "of": n, "counted": False, "updated_at": t}
            for k, n in enumerate(rows)
        ]
        with self.db.transaction() as conn:
            conn.execute(self.db.insert_ignore(shard_progress), values)

    def write_shard(
        self,
        batch_id: str,
        run_id: str,
        p: Progress,
        shard: ShardOf,
        sink: Callable[[Progress], None] | None = None,
    ) -> Progress | None:
        """Record one shard's report and publish the step's sum (to the batch's row, then ``sink``);
        returns what was published, or None when it would have gone back."""
        with self.db.transaction() as conn:
            published = self._lock_published(conn, batch_id, run_id, p)
            self._merge_shard(conn, batch_id, run_id, p, shard)
            total: Progress | None = self._step_sum(conn, batch_id, p, shard)
            if total is not None and published is not None and _goes_back(published, total):
                total = None
            if total is not None:
                values = {"batch_id": batch_id, "run_id": run_id, "updated_at": now(), **total.as_dict()}
                conn.execute(self.db.upsert(progress, ["batch_id"], values))
                if sink is not None:
                    sink(total)  # inside the lock: events are logged in the order their sums were taken
        crash_point(CrashPoint.AFTER_PROGRESS_WRITE)
        return total

    def _lock_published(
        self, conn: sa.Connection, batch_id: str, run_id: str, p: Progress
    ) -> Progress | None:
        """The batch's row, locked (made first, without a count, if missing: there is always a row to
        lock); None unless it is this run's report."""
        first = {
            "batch_id": batch_id,
            "run_id": run_id,
            "updated_at": now(),
            **p.as_dict(),
            "done": 0,
            "of": 0,
        }
        conn.execute(self.db.insert_ignore(progress).values(**first))
        # The row's lock on Postgres; SQLite renders no FOR UPDATE (its BEGIN IMMEDIATE holds the file).
        query = sa.select(progress).where(progress.c.batch_id == batch_id).with_for_update()
        row = conn.execute(query).one()
        if row.run_id != run_id:
            return None
        return Progress(row.step, row.total, row.label, row.done, row.of)

    def _merge_shard(
        self, conn: sa.Connection, batch_id: str, run_id: str, p: Progress, shard: ShardOf
    ) -> None:
        """The shard's count moves only forward: a re-executed shard starts again from 0 but settles
        what its ledger already confirmed at once, so its earlier ``done`` stands until it passes it."""
        key = {"batch_id": batch_id, "step": shard.step, "shards": shard.n, "shard": shard.k}
        row = conn.execute(sa.select(shard_progress).filter_by(**key)).first()
        if shard.finished:
            of = row.of if row is not None and row.counted else 0
            done, counted = of, True
        elif p.counted:
            same = row is not None and row.counted and row.of == p.of
            of, done, counted = p.of, max(p.done, row.done if same and row else 0), True
        else:
            return  # the shard's start: nothing counted yet, its rows stand for it
        values = {
            **key,
            "run_id": run_id,
            "done": min(done, of),
            "of": of,
            "counted": counted,
            "updated_at": now(),
        }
        conn.execute(self.db.upsert(shard_progress, list(key), values))

    def _step_sum(self, conn: sa.Connection, batch_id: str, p: Progress, shard: ShardOf) -> Progress:
        c = shard_progress.c
        rows = conn.execute(
            sa.select(c.done, c.of).where(c.batch_id == batch_id, c.step == shard.step, c.shards == shard.n)
        ).all()
        of = sum(int(r.of) for r in rows)
        done = sum(min(int(r.done), int(r.of)) for r in rows)
        return Progress(p.step, p.total, p.label, done if of else 0, of)

    def write(self, batch_id: str, run_id: str, p: Progress) -> None:
        values = {"batch_id": batch_id, "run_id": run_id, "updated_at": now(), **p.as_dict()}
        with self.db.transaction() as conn:
            conn.execute(self.db.upsert(progress, ["batch_id"], values))
        crash_point(CrashPoint.AFTER_PROGRESS_WRITE)

    def latest(self, batch_id: str) -> Progress | None:
        found = self.latest_of_run(batch_id)
        return found[0] if found is not None else None

    def latest_of_run(self, batch_id: str) -> tuple[Progress, str] | None:
        """The latest report and the run that wrote it: a reader can tell a report of an older run."""
        with self.db.read() as conn:
            row = conn.execute(sa.select(progress).where(progress.c.batch_id == batch_id)).first()
        if row is None:
            return None
        return Progress(row.step, row.total, row.label, row.done, row.of), str(row.run_id)


def event_log_sink(instance: DagsterInstance, run: DagsterRun) -> Callable[[Progress], None]:
    """Reports progress into ``run``'s event log (see the module docstring for why)."""
    from dagster import MetadataValue

    from durable_assets.kit.dagster_internals import EngineEventData

    def emit(p: Progress) -> None:
        instance.report_engine_event(
            f"progress: step {p.step}/{p.total} {p.label}: {p.done}/{p.of}",
            run,
            EngineEventData(metadata={PROGRESS_METADATA_KEY: MetadataValue.json(p.as_dict())}),
        )

    return emit


def progress_from_event(event: DagsterEvent | None) -> Progress | None:
    """The report carried by an engine event written by :func:`event_log_sink`, else None."""
    if event is None or event.event_type_value != "ENGINE_EVENT":
        return None
    metadata = getattr(event.event_specific_data, "metadata", None) or {}
    value = metadata.get(PROGRESS_METADATA_KEY)
    data = getattr(value, "value", None)
    if not isinstance(data, dict):
        return None
    try:
        return Progress(
            int(data["step"]), int(data["total"]), str(data["label"]), int(data["done"]), int(data["of"])
        )
    except (KeyError, TypeError, ValueError):
        return None


class ProgressReporter:
    """Passes on at most one report per ``min_interval_s``, plus always the forced ones (first, last).

    Reports are written by a background thread, latest first: the step hands a report over and goes
    on with its work instead of waiting for two database writes, and when the writer falls behind
    only the newest report is kept (older progress is of no use to anyone). A forced report waits
    until it and everything before it are written, so a step's last report is stored before the
    step's success is, and the event log keeps progress inside its step.

    The row (what `job status`, the API's ``progress`` and ``percent_complete`` read) gets every
    report that passes; the event log (``sink``: the stream, `job run`'s lines, Dagster's run log)
    gets the forced and last ones and at most one other per ``event_interval_s``. An event is a
    Dagster event-log write, several times a row's cost, and a run log of a line every half second
    says nothing a line a second does not.
    """

    def __init__(
        self,
        store: ProgressStore,
        batch_id: str,
        run_id: str,
        min_interval_s: float = 0.5,
        sink: Callable[[Progress], None] | None = None,
        event_interval_s: float = 1.0,
    ) -> None:
        self.store = store
        self.batch_id = batch_id
        self.run_id = run_id
        self.min_interval_s = min_interval_s
        self.sink = sink
        self.event_interval_s = event_interval_s
        self._last_write = 0.0
        self._last_event = 0.0
        self._lock = threading.Lock()
        self._changed = threading.Condition()
        self._pending: tuple[Progress, ShardOf | None, bool] | None = None
        self._writing = False
        self._closed = False
        self._thread = threading.Thread(target=self._run, name="progress-writer", daemon=True)
        self._thread.start()

    def report(self, p: Progress, *, force: bool = False, shard: ShardOf | None = None) -> None:
        """``shard``: the report is one shard's count of its step (see the module docstring)."""
        with self._lock:
            t = now()
            if not force and p.done < p.of and t - self._last_write < self.min_interval_s:
                return
            self._last_write = t
        with self._changed:
            # A forced report superseded before it was written hands its event on to the newer one.
            force = force or (self._pending is not None and self._pending[2])
            self._pending = (p, shard, force)
            self._changed.notify_all()
        if force:
            self.flush()

    def flush(self, timeout_s: float = 30.0) -> None:
        """Wait until every report handed over so far is written."""
        with self._changed:
            self._changed.wait_for(lambda: self._pending is None and not self._writing, timeout=timeout_s)

    def close(self) -> None:
        self.flush()
        with self._changed:
            self._closed = True
            self._changed.notify_all()
        self._thread.join(timeout=5)

    def _write(self, p: Progress, shard: ShardOf | None, force: bool) -> None:
        sink = self._event_sink(p, force)
        if shard is not None:
            self.store.write_shard(self.batch_id, self.run_id, p, shard, sink)
            return
        self.store.write(self.batch_id, self.run_id, p)
        if sink is not None:
            sink(p)

    def _event_sink(self, p: Progress, force: bool) -> Callable[[Progress], None] | None:
        """The sink if this report goes to the event log too (see the class docstring), else None."""
        if self.sink is None:
            return None
        t = now()
        if not force and p.done < p.of and t - self._last_event < self.event_interval_s:
            return None
        self._last_event = t
        return self.sink

    def _run(self) -> None:
        while True:
            with self._changed:
                self._changed.wait_for(lambda: self._pending is not None or self._closed)
                if self._pending is None:
                    return
                (p, shard, force), self._pending, self._writing = self._pending, None, True
            try:
                self._write(p, shard, force)
            except Exception:  # progress is advisory: a failed write must never fail the batch
                logger.warning("progress report not stored", exc_info=True)
            finally:
                with self._changed:
                    self._writing = False
                    self._changed.notify_all()


def _goes_back(published: Progress, total: Progress) -> bool:
    """Whether ``total`` shows less than ``published`` did: an earlier step, or less of the same one
    (a late report of a superseded shard, or one summed before another shard's that was published)."""
    if published.step != total.step:
        return published.step > total.step
    if not published.counted:
        return False
    if not total.counted:
        return True
    return total.done * published.of < published.done * total.of
