"""What the end-of-batch summary shows for the refund job: labels for its steps' metadata.

Each line names where its number comes from (step, metadata key); when several steps report it,
the last one that did wins (a re-run step or the report repeats an earlier figure). See
``durable_assets/ops/summary.py`` for how lines are read and printed.
"""

from __future__ import annotations

from durable_assets.kit.reports import SummaryLine, batch_summary_spec, held_for_review_line, rows_line

REFUND_SUMMARY = batch_summary_spec(
    read=("records read", "invoices"),
    validated="validated_invoices",
    report="batch_report",
    lines=(
        rows_line("refund candidates", "refund_candidates"),
        SummaryLine(
            "refunds issued",
            (("issued_refunds", "refunds_issued"), ("batch_report", "refunds")),
            detail=("batch_report", "refunded_by_currency_cents"),
            money_detail=True,
        ),
        held_for_review_line("issued_refunds", "batch_report"),
        SummaryLine("mismatched at provider", (("reconciled_refunds", "mismatched"),)),
        SummaryLine("notices sent", (("customer_notices", "notices_sent"), ("batch_report", "notices_sent"))),
    ),
    review_hint="the rows of the report with status held_for_review, and their review_note",
)
