"""User-facing progress inside long steps, throttled so reporting never slows the work.

Each report that passes the throttle goes to two places: the ``durable_progress`` row (the latest
report per batch, what polling clients read) and the run's Dagster event log as an engine event.
The event log is where step starts, successes and run status changes already are, so a progress
report gets a storage id in the same sequence: a stream can interleave progress with step and
status events in their true order and resume after any of them. The UI shows the reports too.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING

import sqlalchemy as sa

from durable_assets.kit.db import DurableDatabase, now, progress

if TYPE_CHECKING:
    from dagster import DagsterEvent, DagsterInstance, DagsterRun

#: Metadata key that marks an engine event as a progress report.
PROGRESS_METADATA_KEY = "durable/progress"


@dataclass(frozen=True)
class Progress:
    step: int
    total: int
    label: str
    done: int
    of: int

    def as_dict(self) -> dict[str, int | str]:
        return asdict(self)


class ProgressStore:
    def __init__(self, db: DurableDatabase) -> None:
        self.db = db

    def write(self, batch_id: str, run_id: str, p: Progress) -> None:
        values = {"batch_id": batch_id, "run_id": run_id, "updated_at": now(), **p.as_dict()}
        with self.db.transaction() as conn:
            conn.execute(self.db.upsert(progress, ["batch_id"], values))

    def latest(self, batch_id: str) -> Progress | None:
        with self.db.engine.connect() as conn:
            row = conn.execute(sa.select(progress).where(progress.c.batch_id == batch_id)).first()
        if row is None:
            return None
        return Progress(row.step, row.total, row.label, row.done, row.of)


def event_log_sink(instance: DagsterInstance, run: DagsterRun) -> Callable[[Progress], None]:
    """Reports progress into ``run``'s event log (see the module docstring for why)."""
    from dagster import MetadataValue
    from dagster._core.events import EngineEventData

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
    """Writes at most one report per ``min_interval_s``, plus always the forced ones (first, last)."""

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

    def report(self, p: Progress, *, force: bool = False) -> None:
        with self._lock:
            t = now()
            if not force and p.done < p.of and t - self._last_write < self.min_interval_s:
                return
            self._last_write = t
        self.store.write(self.batch_id, self.run_id, p)
        if self.sink is not None:
            self.sink(p)
