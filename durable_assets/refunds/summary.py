"""What the end-of-batch summary shows for the refund job: labels for its steps' metadata.

Each line names where its number comes from (step, metadata key); when several steps report it,
the last one that did wins (a re-run step or the report repeats an earlier figure). See
``durable_assets/ops/summary.py`` for how lines are read and printed.
"""

from __future__ import annotations

from durable_assets.kit import (
    HELD_FOR_REVIEW_KEY,
    SummaryLine,
    SummarySpec,
    quarantine_file,
    quarantine_line,
    report_file,
)

REFUND_SUMMARY = SummarySpec(
    lines=(
        SummaryLine("records read", (("invoices", "rows"),)),
        quarantine_line("validated_invoices"),
        SummaryLine("refund candidates", (("refund_candidates", "rows"),)),
        SummaryLine(
            "refunds issued",
            (("issued_refunds", "refunds_issued"), ("batch_report", "refunds")),
            detail=("batch_report", "refunded_by_currency_cents"),
            money_detail=True,
        ),
        SummaryLine(
            "held for review",
            (("issued_refunds", HELD_FOR_REVIEW_KEY), ("batch_report", HELD_FOR_REVIEW_KEY)),
        ),
        SummaryLine("mismatched at provider", (("reconciled_refunds", "mismatched"),)),
        SummaryLine("notices sent", (("customer_notices", "notices_sent"), ("batch_report", "notices_sent"))),
    ),
    files=(
        report_file("batch_report"),
        quarantine_file("validated_invoices"),
    ),
    review_hint="the rows of the report with status held_for_review, and their review_note",
)
