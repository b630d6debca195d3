"""The invoice-refund pipeline as a durable job: the descriptor the operations layer reads."""

from __future__ import annotations

from durable_assets.kit import DurableJob
from durable_assets.refunds.assets import ALL_ASSETS, enforce_guardrails
from durable_assets.refunds.checks import ALL_CHECKS
from durable_assets.refunds.schedules import DAILY_REFUNDS
from durable_assets.refunds.summary import REFUND_SUMMARY
from durable_assets.refunds.validation import read_invoice_file

REFUND_JOB = "refund_batch"

refund_batch = DurableJob(
    REFUND_JOB,
    assets=ALL_ASSETS,
    checks=ALL_CHECKS,
    summary=REFUND_SUMMARY,
    daily=DAILY_REFUNDS,
    check_input=read_invoice_file,
    # Distributed runs shard issued_refunds and customer_notices; the ceilings see the whole batch.
    shard_guards={
        "issued_refunds": lambda candidates, resources: enforce_guardrails(candidates, resources["limits"])
    },
    description=(
        "One refund batch, end to end: invoices are validated, refunds computed by policy, issued "
        "exactly once at the payment provider, reconciled, and customers notified. Partition = batch ID."
    ),
)
