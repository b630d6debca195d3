"""A batch's outcome as a person and a script read it: the summary, held items, the exit code.

Issue #14 defect 8: a batch whose refunds were all held for review ended `succeeded`, exit 0, and
nothing said a person was needed. Issue #15 item 2: the summary printed only file paths.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from dagster import DagsterInstance
from prometheus_client.parser import text_string_to_metric_families

from durable_assets.ops.metrics import render_metrics
from durable_assets.ops.status import batch_runs, held_for_review
from durable_assets.ops.summary import SummarySpec, batch_summary, format_money, format_seconds
from durable_assets.ops.webhooks.batch import terminal_event
from tests.conftest import job_cli

HEADER = (
    "invoice_id,customer_id,customer_email,charge_id,currency,amount_charged,contracted_amount,"
    "already_refunded,service_period,charged_at,cancelled_at\n"
)


def _metrics(instance: DagsterInstance) -> dict[str, float]:
    return {
        s.name: s.value
        for family in text_string_to_metric_families(render_metrics(instance))
        for s in family.samples
        if not s.labels or s.labels == {"scope": "refund"}
    }


@pytest.mark.slow
def test_a_batch_whose_refunds_are_all_held_needs_review(dagster_home: Path, tmp_path: Path) -> None:
    # Neither charge exists at the (embedded) provider: each refund's answer does not match the
    # request, so verify_refund holds both for review and none is recorded as done.
    rows = [
        "H1,C1,a@x.com,ch_missing_1,usd,12.00,10.00,0,2026-10,2026-10-01T00:00:00Z,",
        "H2,C2,b@x.com,ch_missing_2,eur,30.00,25.00,0,2026-10,2026-10-01T00:00:00Z,",
    ]
    path = tmp_path / "held.csv"
    path.write_text(HEADER + "\n".join(rows) + "\n")

    result = job_cli("run", "--id", "held", "--invoices", str(path))
    assert result.returncode == 4, result.stdout + result.stderr  # finished, items held for review
    assert "batch held: succeeded" in result.stdout
    assert "needs review: 2 items held for a person" in result.stdout
    assert "exit 4" in result.stderr and "Traceback" not in result.stderr

    status = json.loads(job_cli("status", "--id", "held", "--json").stdout)
    assert status["status"] == "succeeded"  # Dagster's run did succeed
    assert status["needs_review"] is True and status["held_for_review"] == 2
    listed = json.loads(job_cli("list", "--json").stdout)
    assert listed[0]["needs_review"] is True and listed[0]["held_for_review"] == 2
    assert "needs review: 2" in job_cli("list").stdout
    assert "needs review: 2" in job_cli("status", "--id", "held").stdout

    # `resume` of the succeeded batch does nothing (exit 0, docs/contract.md) but still says so.
    resumed = job_cli("resume", "--id", "held")
    assert resumed.returncode == 0 and "2 held for review" in resumed.stdout

    with DagsterInstance.get() as instance:
        # The webhook's data is the status JSON: a receiver sees the same fields.
        event, why = terminal_event(instance, batch_runs(instance, "held")[-1].run_id)
        assert event is not None, why
        body = json.loads(event.body)
        assert body["type"] == "batch.succeeded"
        assert body["data"]["needs_review"] is True and body["data"]["held_for_review"] == 2

        ok = job_cli("run", "--id", "fine", "--size", "40")
        assert ok.returncode == 0, ok.stderr
        metrics = _metrics(instance)
    assert metrics["durable_batches_needing_review"] == 1
    assert metrics["durable_items_held_for_review"] == 2
    assert metrics["durable_effects_held_for_review_total"] == 2  # the ledger's review rows agree


@pytest.mark.slow
def test_the_summary_says_what_the_batch_did(dagster_home: Path) -> None:
    result = job_cli("run", "--id", "sum", "--size", "1000")
    assert result.returncode == 0, result.stderr
    out = result.stdout
    # The synthetic 1000 invoices hold 10 deliberately malformed rows (1%): quarantined, by reason.
    assert "records read" in out and "1,000" in out
    line = next(x for x in out.splitlines() if x.strip().startswith("quarantined"))
    assert line.split()[1] == "10" and "negative_amount" in out
    issued = next(x for x in out.splitlines() if x.strip().startswith("refunds issued"))
    assert int(issued.split()[2].replace(",", "")) > 0 and "USD " in out
    for label in ("refund candidates", "held for review", "notices sent", "elapsed", "report", "quarantine"):
        assert label in out, out
    status = json.loads(job_cli("status", "--id", "sum", "--json").stdout)
    assert status["held_for_review"] == 0

    with DagsterInstance.get() as instance:
        generic = batch_summary(instance, "sum", "succeeded", SummarySpec()).render()
        fallback = batch_summary(instance, "sum", "succeeded", None).render()
    assert "records read" not in generic  # a job's own spec decides its lines
    assert "issued_refunds: refunds issued" in fallback  # without one, every step's numbers


def test_formatting() -> None:
    assert format_money({"usd": 123456, "eur": 5, "gbp": -250}) == "EUR 0.05, GBP -2.50, USD 1,234.56"
    assert format_seconds(6.04) == "6.0 s" and format_seconds(125) == "2 min 05 s"
    assert format_seconds(3725) == "1 h 02 min"


def test_the_last_step_reporting_held_for_review_decides() -> None:
    assert held_for_review([{}, {"rows": 5}]) == 0
    # The refund job: the refund step holds 3, the report repeats them (not 6).
    assert held_for_review([{"held_for_review": 3}, {"rows": 1}, {"held_for_review": 3}]) == 3
    # A later step that settled what an earlier one held reports 0: the batch needs no one.
    assert held_for_review([{"held_for_review": 2}, {"held_for_review": 0}]) == 0
    assert held_for_review([{"held_for_review": True}]) == 0  # a flag is not a count
