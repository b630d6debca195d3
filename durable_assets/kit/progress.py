"""User-facing progress inside long steps, throttled so reporting never slows the work."""

from __future__ import annotations

import threading
from dataclasses import asdict, dataclass

import sqlalchemy as sa

from durable_assets.kit.db import DurableDatabase, now, progress


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


class ProgressReporter:
    """Writes at most one row per ``min_interval_s``, plus always the first and the last."""

    def __init__(self, store: ProgressStore, batch_id: str, run_id: str, min_interval_s: float = 0.5) -> None:
        self.store = store
        self.batch_id = batch_id
        self.run_id = run_id
        self.min_interval_s = min_interval_s
        self._last_write = 0.0
        self._lock = threading.Lock()

    def report(self, p: Progress, *, force: bool = False) -> None:
        with self._lock:
            t = now()
            if not force and p.done < p.of and t - self._last_write < self.min_interval_s:
                return
            self._last_write = t
        self.store.write(self.batch_id, self.run_id, p)
