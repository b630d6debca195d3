"""``/metrics`` for durable-assets: Prometheus text derived from the instance's state at scrape time.

Counters are totals over what storage still holds (runs, events, ledger and outbox rows); when
retention prunes old batches a total may drop, which Prometheus treats as a counter reset
(``rate()``/``increase()`` stay correct). Idempotency keys outlive runs, so the side-effect totals
are the ledger's, across every batch and job, labelled by the effect's ledger scope (``refund``,
``customer``, ...). Use :func:`render_metrics` from any server route.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Iterator

import sqlalchemy as sa
from dagster import DagsterInstance, DagsterRun
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from durable_assets.kit.runtime import (
    BATCH_TAG,
    FINISHED,
    HELD_FOR_REVIEW_KEY,
    REVIEW,
    DurableDatabase,
    cancel_requests,
    worker_lost_reason,
)
from durable_assets.ops.code_changes import code_model
from durable_assets.ops.job_shape import stored_code_versions
from durable_assets.ops.metrics.digests import RunDigest, RunDigests, histogram, ledger_counts, render
from durable_assets.ops.registry import durable_jobs
from durable_assets.ops.status import held_for_review, is_auto_resume, run_status_label
from durable_assets.ops.status_model import BatchStatus
from durable_assets.ops.webhooks.outbox import DELIVERED, FAILED, PENDING, Outbox

__all__ = ["DurableMetrics", "render_metrics"]

#: The metadata key by which a mutating step reports intents it found settled and did not send again.
REPLAYED_KEY = "reused_from_ledger"
BATCH_STATUSES = tuple(BatchStatus)

_digests = RunDigests()


class DurableMetrics:
    """A prometheus_client collector over one Dagster instance."""

    def __init__(self, instance: DagsterInstance) -> None:
        self.instance = instance
        self.db = DurableDatabase.for_instance(instance)

    def collect(self) -> Iterator[Metric]:
        runs = [r for r in self.instance.get_runs() if r.tags.get(BATCH_TAG)]  # newest first
        digests = _digests.for_runs(self.instance, runs)
        yield self._batches(runs)
        yield from self._review(runs, digests)
        yield from self._effects(digests)
        yield CounterMetricFamily(
            "durable_lease_expiries",
            "Runs failed because their worker stopped renewing its lease (dead worker detected).",
            value=sum(1 for r in runs if worker_lost_reason(r.tags)),
        )
        yield CounterMetricFamily(
            "durable_resumes",
            "Re-executions of a batch (job resume, UI re-execution, automatic retry): runs with a parent.",
            value=sum(1 for r in runs if r.parent_run_id),
        )
        yield CounterMetricFamily(
            "durable_auto_resumes",
            "Re-executions started by the daemon's automatic resume after a lost worker whose retry "
            "Dagster dropped.",
            value=sum(1 for r in runs if is_auto_resume(r)),
        )
        yield self._code_changed(runs)
        yield from self._webhooks()
        steps: dict[str, list[float]] = defaultdict(list)
        for digest in digests:
            for step, seconds in digest.step_seconds:
                steps[step].append(seconds)
        yield histogram(
            "durable_step_duration_seconds",
            "Duration of each successful step execution (STEP_SUCCESS events), by step.",
            "step",
            steps,
        )

    def _batches(self, runs: list[DagsterRun]) -> GaugeMetricFamily:
        newest: dict[str, BatchStatus] = {}
        for run in runs:  # newest first: the first run seen of a batch decides its status
            newest.setdefault(run.tags[BATCH_TAG], run_status_label(run))
        with self.db.read() as conn:
            canceling = {row[0] for row in conn.execute(sa.select(cancel_requests.c.batch_id)).all()}
        counts = Counter(
            BatchStatus.CANCELING if s == BatchStatus.RUNNING and b in canceling else s
            for b, s in newest.items()
        )
        family = GaugeMetricFamily("durable_batches", "Batches by current status.", labels=["status"])
        for status in BATCH_STATUSES:
            family.add_metric([status], counts.get(status, 0))
        return family

    def _review(self, runs: list[DagsterRun], digests: list[RunDigest]) -> Iterator[Metric]:
        """Batches that need a person, by the status JSON's rule (``status.held_for_review``)."""
        latest: dict[str, dict[str, dict[str, float]]] = defaultdict(dict)  # batch -> step -> metadata
        for run, digest in reversed(list(zip(runs, digests, strict=True))):  # oldest first: newest wins
            for asset, numeric in digest.materialized:
                values = dict(numeric)
                if HELD_FOR_REVIEW_KEY in values:
                    latest[run.tags[BATCH_TAG]][asset] = values
        jobs = durable_jobs()
        job_of = {run.tags[BATCH_TAG]: jobs.owning(run.job_name) or jobs.default for run in runs}
        held = {
            batch: held_for_review([per_step.get(step, {}) for step in job_of[batch].step_keys])
            for batch, per_step in latest.items()
        }
        yield GaugeMetricFamily(
            "durable_batches_needing_review",
            "Batches with items held for a person (status JSON `needs_review`), whatever their status.",
            value=sum(1 for n in held.values() if n > 0),
        )
        yield GaugeMetricFamily(
            "durable_items_held_for_review",
            "Items held for review across all batches still in storage (sum of `held_for_review`).",
            value=sum(held.values()),
        )

    def _code_changed(self, runs: list[DagsterRun]) -> GaugeMetricFamily:
        """Failed batches that only a person may resume: their code changed since they started in a
        step that recorded effects (status ``code.changed``); no automatic resume crosses that."""
        newest: dict[str, DagsterRun] = {}
        for run in runs:  # newest first
            newest.setdefault(run.tags[BATCH_TAG], run)
        changed = 0
        for batch, run in newest.items():
            if run_status_label(run) == BatchStatus.FAILED:
                code = code_model(self.db, batch, stored_code_versions(self.instance, run))
                changed += code is not None and bool(code.changed)
        return GaugeMetricFamily(
            "durable_batches_code_changed",
            "Failed batches whose deployed code changed since they started (status `code.changed`): "
            "a person resumes them, with the old code back or `job resume --accept-code-change`.",
            value=changed,
        )

    def _effects(self, digests: list[RunDigest]) -> Iterator[Metric]:
        counts = ledger_counts(self.db)
        requested = CounterMetricFamily(
            "durable_effects_requested",
            "Side effects whose intent was committed before the foreign call (one per idempotency key).",
            labels=["scope"],
        )
        created = CounterMetricFamily(
            "durable_effects_created",
            "Side effects the foreign system confirmed and the ledger recorded as finished.",
            labels=["scope"],
        )
        review = CounterMetricFamily(
            "durable_effects_held_for_review",
            "Side effects whose answer did not match the request: held for a person, never retried.",
            labels=["scope"],
        )
        for scope in sorted({scope for scope, _point in counts}):
            requested.add_metric([scope], sum(n for (sc, _p), n in counts.items() if sc == scope))
            created.add_metric([scope], counts.get((scope, FINISHED), 0))
            review.add_metric([scope], counts.get((scope, REVIEW), 0))
        yield requested
        yield created
        yield review
        replayed: dict[str, float] = defaultdict(float)
        for digest in digests:
            for step, numeric in digest.materialized:
                replayed[step] += dict(numeric).get(REPLAYED_KEY, 0.0)
        family = CounterMetricFamily(
            "durable_effects_replayed",
            "Side effects a re-executed step found already settled in the ledger and did not send again.",
            labels=["step"],
        )
        for step in sorted(replayed):
            family.add_metric([step], replayed[step])
        yield family

    def _webhooks(self) -> Iterator[Metric]:
        stats = Outbox(self.db).stats()
        deliveries = CounterMetricFamily(
            "durable_webhook_deliveries",
            "Webhook deliveries (one per event and URL) by outcome: delivered, or failed (given up).",
            labels=["outcome"],
        )
        deliveries.add_metric([DELIVERED], stats[DELIVERED])
        deliveries.add_metric([FAILED], stats[FAILED])
        yield deliveries
        yield GaugeMetricFamily(
            "durable_webhook_deliveries_pending",
            "Webhook deliveries waiting in the outbox (retry backoff, or a receiver down).",
            value=stats[PENDING],
        )
        yield CounterMetricFamily(
            "durable_webhook_delivery_failures",
            "Webhook POST attempts that did not get a 2xx (connection errors, 4xx, 5xx).",
            value=stats["attempts"] - stats[DELIVERED],
        )


def render_metrics(instance: DagsterInstance) -> str:
    """The Prometheus text exposition (``text/plain; version=0.0.4``) for ``GET /metrics``."""
    return render(DurableMetrics(instance))
