"""What the end-of-batch summary shows for the credit migration: labels for its steps' metadata."""

from __future__ import annotations

from durable_assets.kit.reports import SummaryLine, batch_summary_spec, held_for_review_line

CREDIT_SUMMARY = batch_summary_spec(
    read=("accounts read", "legacy_accounts"),
    validated="validated_accounts",
    report="migration_report",
    lines=(
        SummaryLine("customers", (("provider_customers", "customers"),)),
        SummaryLine("customers created", (("provider_customers", "requests_sent"),)),
        SummaryLine(
            "balances adjusted",
            (("applied_adjustments", "adjustments_applied"), ("migration_report", "adjustments_applied")),
            detail=("migration_report", "applied_by_currency_cents"),
            money_detail=True,
        ),
        SummaryLine(
            "already at target", (("applied_adjustments", "unchanged"), ("migration_report", "unchanged"))
        ),
        held_for_review_line("provider_customers", "applied_adjustments", "migration_report"),
        SummaryLine(
            "decided by a person",
            (("applied_adjustments", "decided_by_person"), ("migration_report", "decided_by_person")),
        ),
        SummaryLine("balances verified", (("verified_balances", "matched"),)),
        SummaryLine("mismatched at provider", (("verified_balances", "mismatched"),)),
    ),
    review_hint="the rows of the migration report with status held_for_review, and their review_note",
)
