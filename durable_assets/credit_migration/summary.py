"""What the end-of-batch summary shows for the credit migration: labels for its steps' metadata."""

from __future__ import annotations

from durable_assets.kit import HELD_FOR_REVIEW_KEY, SummaryLine, SummarySpec

CREDIT_SUMMARY = SummarySpec(
    lines=(
        SummaryLine("accounts read", (("legacy_accounts", "rows"),)),
        SummaryLine(
            "quarantined",
            (("validated_accounts", "quarantined"),),
            detail=("validated_accounts", "quarantine_reasons"),
        ),
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
        ("report", "migration_report", "report_file"),
        ("quarantine", "validated_accounts", "quarantine_file"),
    ),
    review_hint="the rows of the migration report with status held_for_review, and their review_note",
)
