"""User-facing progress inside long steps, throttled so reporting never slows the work.

Each report that passes the throttle goes to two places: the ``durable_progress`` row (the latest
report per batch, what polling clients read) and the run's Dagster event log as an engine event.
The event log is where step starts, successes and run status changes already are, so a progress
report gets a storage id in the same sequence: a stream can interleave progress with step and
status events in their true order and resume after any of them. The UI shows the reports too.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING

import sqlalchemy as sa

from durable_assets.kit.crashpoints import CrashPoint, crash_point
from durable_assets.kit.db import DurableDatabase, now, progress
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


class ProgressStore:
    def __init__(self, db: DurableDatabase) -> None:
        self.db = db

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
    """

    def __init__(
        self,
        store: ProgressStore,
        batch_id: str,
        run_id: str,
        min_interval_s: float = 0.5,
        sink: Callable[[Progress], None] | None = None,
    ) -> None:
        self.store = store
        self.batch_id = batch_id
        self.run_id = run_id
        self.min_interval_s = min_interval_s
        self.sink = sink
        self._last_write = 0.0
        self._lock = threading.Lock()
        self._changed = threading.Condition()
        self._pending: Progress | None = None
        self._writing = False
        self._closed = False
        self._thread = threading.Thread(target=self._run, name="progress-writer", daemon=True)
        self._thread.start()

    def report(self, p: Progress, *, force: bool = False) -> None:
        with self._lock:
            t = now()
            if not force and p.done < p.of and t - self._last_write < self.min_interval_s:
                return
            self._last_write = t
        with self._changed:
            self._pending = p
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

    def _write(self, p: Progress) -> None:
        self.store.write(self.batch_id, self.run_id, p)
        if self.sink is not None:
            self.sink(p)

    def _run(self) -> None:
        while True:
            with self._changed:
                self._changed.wait_for(lambda: self._pending is not None or self._closed)
                if self._pending is None:
                    return
                p, self._pending, self._writing = self._pending, None, True
            try:
                self._write(p)
            except Exception:  # progress is advisory: a failed write must never fail the batch
                logger.warning("progress report not stored", exc_info=True)
            finally:
                with self._changed:
                    self._writing = False
                    self._changed.notify_all()
