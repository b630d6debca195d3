"""Prometheus metrics read from state that exists anyway, never from counters we would keep in sync.

Every number is derived at scrape time from Dagster's run storage and event log or from our tables
(ledger, outbox): a crashed worker cannot leave a metric behind that disagrees with the truth, and
there is nothing to increment on any code path. The price is the reading; what is expensive (the
events of each run) is read once per finished run and kept, since a finished run's events no
longer change.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

import sqlalchemy as sa
from dagster import DagsterEventType, DagsterInstance, DagsterRun
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import HistogramMetricFamily
from prometheus_client.registry import Collector

from durable_assets.kit.runtime import DurableDatabase, idempotency

#: Step durations span a 20 ms validation to an hour-long refund step.
STEP_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0, 900.0, 3600.0)


def ledger_counts(db: DurableDatabase) -> dict[tuple[str, str], int]:
    """Idempotency keys per (scope, recovery point): one GROUP BY over the ledger."""
    c = idempotency.c
    with db.read() as conn:
        rows = conn.execute(
            sa.select(c.scope, c.recovery_point, sa.func.count()).group_by(c.scope, c.recovery_point)
        ).all()
    return {(str(scope), str(point)): int(n) for scope, point, n in rows}


@dataclass(frozen=True)
class RunDigest:
    """What metrics need from one run's event log: step durations and numeric materialization metadata."""

    step_seconds: tuple[tuple[str, float], ...]
    materialized: tuple[tuple[str, tuple[tuple[str, float], ...]], ...]

    def metadata(self, asset: str, key: str) -> float:
        return sum(dict(meta).get(key, 0.0) for name, meta in self.materialized if name == asset)


class RunDigests:
    """Per-run digests, computed once for finished runs (their events never change again)."""

    def __init__(self) -> None:
        self._done: dict[str, RunDigest] = {}
        self._lock = threading.Lock()

    def for_runs(self, instance: DagsterInstance, runs: Sequence[DagsterRun]) -> list[RunDigest]:
        out = []
        with self._lock:
            for run in runs:
                digest = self._done.get(run.run_id)
                if digest is None:
                    digest = _digest(instance, run.run_id)
                    if run.is_finished:
                        self._done[run.run_id] = digest
                out.append(digest)
            live = {r.run_id for r in runs}
            for gone in [rid for rid in self._done if rid not in live]:  # pruned by retention
                del self._done[gone]
        return out


def _digest(instance: DagsterInstance, run_id: str) -> RunDigest:
    steps: list[tuple[str, float]] = []
    materialized: list[tuple[str, tuple[tuple[str, float], ...]]] = []
    kinds = {DagsterEventType.STEP_SUCCESS, DagsterEventType.ASSET_MATERIALIZATION}
    for record in instance.all_logs(run_id, of_type=kinds):
        event = record.dagster_event
        if event is None:
            continue
        if event.event_type == DagsterEventType.STEP_SUCCESS and event.step_key:
            duration_ms = getattr(event.event_specific_data, "duration_ms", None)
            if duration_ms is not None:
                steps.append((event.step_key, float(duration_ms) / 1000.0))
        elif event.event_type == DagsterEventType.ASSET_MATERIALIZATION:
            mat = event.step_materialization_data.materialization
            numeric = tuple(
                (k, float(v.value))
                for k, v in mat.metadata.items()
                if isinstance(v.value, int | float) and not isinstance(v.value, bool)
            )
            materialized.append((mat.asset_key.path[-1], numeric))
    return RunDigest(tuple(steps), tuple(materialized))


def histogram(
    name: str,
    documentation: str,
    label: str,
    observations: Mapping[str, Iterable[float]],
    buckets: Sequence[float] = STEP_BUCKETS,
) -> HistogramMetricFamily:
    """A Prometheus histogram (cumulative buckets, +Inf, sum) per label value, from raw observations."""
    family = HistogramMetricFamily(name, documentation, labels=[label])
    for value in sorted(observations):
        seen = sorted(observations[value])
        cumulative = [(str(b), float(sum(1 for x in seen if x <= b))) for b in buckets]
        cumulative.append(("+Inf", float(len(seen))))
        family.add_metric([value], cumulative, sum_value=sum(seen))
    return family


def render(collector: Collector) -> str:
    """Prometheus text exposition (format 0.0.4) of one collector's metrics, collected once."""
    registry = CollectorRegistry(auto_describe=False)  # no describe(): register() does not collect
    registry.register(collector)
    return generate_latest(registry).decode()
