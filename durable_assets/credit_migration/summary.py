"""What the end-of-batch summary shows for the credit migration: labels for its steps' metadata."""

from __future__ import annotations

from durable_assets.kit import (
    HELD_FOR_REVIEW_KEY,
    SummaryLine,
    SummarySpec,
    quarantine_file,
    quarantine_line,
    report_file,
)

CREDIT_SUMMARY = SummarySpec(
    lines=(
        SummaryLine("accounts read", (("legacy_accounts", "rows"),)),
        quarantine_line("validated_accounts"),
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
        SummaryLine(
            "held for review",
            (
                ("provider_customers", HELD_FOR_REVIEW_KEY),
                ("applied_adjustments", HELD_FOR_REVIEW_KEY),
                ("migration_report", HELD_FOR_REVIEW_KEY),
            ),
        ),
        SummaryLine("balances verified", (("verified_balances", "matched"),)),
        SummaryLine("mismatched at provider", (("verified_balances", "mismatched"),)),
    ),
    files=(
        report_file("migration_report"),
        quarantine_file("validated_accounts"),
    ),
    review_hint="the rows of the migration report with status held_for_review, and their review_note",
)
