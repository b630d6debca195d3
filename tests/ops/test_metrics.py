"""``render_metrics``: parsed with Prometheus' own parser, its numbers match real batches' outcomes."""

from __future__ import annotations

import base64
import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from dagster import DagsterInstance, DagsterRunStatus, ReexecutionOptions, execute_job, reconstructable
from prometheus_client.parser import text_string_to_metric_families

from durable_assets.definitions import refund_batch_job
from durable_assets.kit.tags import BATCH_TAG, WORKER_LOST_TAG
from durable_assets.ops import runner
from durable_assets.ops.metrics import render_metrics
from durable_assets.payments.store import PaymentStore
from tests.webhooks.receiver import Receiver

SIZE = 40


def _samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    out = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def _one(samples: dict, name: str, **labels: str) -> float:  # type: ignore[type-arg]
    return float(samples[(name, tuple(sorted(labels.items())))])


def test_empty_instance_renders_zeros(dagster_home: Path) -> None:
    with DagsterInstance.get() as instance:
        text = render_metrics(instance)
    s = _samples(text)
    assert _one(s, "durable_batches", status="running") == 0
    assert "durable_effects_requested_total{" not in text
    assert "# TYPE durable_effects_created_total counter" in text
    assert "# TYPE durable_step_duration_seconds histogram" in text


@pytest.fixture
def flaky_receiver() -> Iterator[Receiver]:
    r = Receiver("whsec_" + base64.b64encode(os.urandom(32)).decode(), script={"/hook": [(500, {})]})
    yield r
    r.close()


@pytest.mark.slow
def test_counters_match_known_batch_outcomes(
    dagster_home: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, flaky_receiver: Receiver
) -> None:
    r, secret = flaky_receiver, flaky_receiver.secret  # one failed attempt, then delivered
    monkeypatch.setenv("DURABLE_WEBHOOK_URLS", r.url())
    monkeypatch.setenv("DURABLE_WEBHOOK_SECRET", secret)
    monkeypatch.setenv("DURABLE_WEBHOOK_BACKOFF_BASE_S", "0.05")
    bad = tmp_path / "bad.csv"
    bad.write_text("invoice_id\nx\n")
    with DagsterInstance.get() as instance:
        ok = runner.start_batch(instance, "m-ok", size=SIZE)
        assert ok.status == DagsterRunStatus.SUCCESS
        refunds = PaymentStore(str(dagster_home / "payments.db")).stats()["refunds_created"]
        assert refunds > 0
        # A UI-style re-execution of the refund step onwards: every refund comes from the ledger.
        again = execute_job(
            reconstructable(refund_batch_job),
            instance,
            reexecution_options=ReexecutionOptions(
                parent_run_id=ok.run_id, step_selection=["issued_refunds*"]
            ),
            tags={BATCH_TAG: "m-ok", "dagster/partition": "m-ok"},
        )
        assert again.success
        failed = runner.start_batch(instance, "m-fail", input_path=str(bad), size=SIZE)
        assert failed.status == DagsterRunStatus.FAILURE
        instance.add_run_tags(failed.run_id, {WORKER_LOST_TAG: "lease expired"})
        s = _samples(render_metrics(instance))

    assert PaymentStore(str(dagster_home / "payments.db")).stats()["refunds_created"] == refunds
    assert _one(s, "durable_batches", status="succeeded") == 1
    assert _one(s, "durable_batches", status="failed") == 1
    assert (
        sum(_one(s, "durable_batches", status=x) for x in ("queued", "running", "canceling", "canceled")) == 0
    )
    assert _one(s, "durable_effects_requested_total", scope="refund") == refunds
    assert _one(s, "durable_effects_created_total", scope="refund") == refunds
    assert _one(s, "durable_effects_held_for_review_total", scope="refund") == 0
    assert _one(s, "durable_effects_replayed_total", step="issued_refunds") == refunds
    assert _one(s, "durable_lease_expiries_total") == 1
    assert _one(s, "durable_resumes_total") == 1
    assert _one(s, "durable_auto_resumes_total") == 0  # a re-execution, not the daemon's automatic resume
    assert _one(s, "durable_webhook_deliveries_total", outcome="delivered") == 2  # m-ok and m-fail
    assert _one(s, "durable_webhook_deliveries_total", outcome="failed") == 0
    assert _one(s, "durable_webhook_deliveries_pending") == 0
    assert _one(s, "durable_webhook_delivery_failures_total") == 1  # the 500
    # Steps: `invoices` succeeded once (m-fail failed in it); the refund step and the report twice.
    assert _one(s, "durable_step_duration_seconds_count", step="invoices") == 1
    assert _one(s, "durable_step_duration_seconds_count", step="issued_refunds") == 2
    assert _one(s, "durable_step_duration_seconds_count", step="batch_report") == 2
    assert _one(s, "durable_step_duration_seconds_bucket", step="batch_report", le="+Inf") == 2
    assert _one(s, "durable_step_duration_seconds_sum", step="issued_refunds") > 0
