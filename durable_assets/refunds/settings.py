"""The refund batch's own variables: its guardrails' ceilings and the daily schedule's input.

Declared by the pipeline that uses them (no other layer knows a refund); read where the code
location is wired (durable_assets/definitions.py), which gives them to :class:`RefundLimits`.
"""

from __future__ import annotations

from durable_assets.settings import Section, var


class RefundSettings(Section):
    """The refund batch's limits and daily input."""

    max_refunds_per_batch: int = var(
        "DURABLE_MAX_REFUNDS_PER_BATCH", 100_000, "refund batch: ceiling on refunds per batch", ge=0
    )
    max_amount_per_batch_cents: int = var(
        "DURABLE_MAX_AMOUNT_PER_BATCH_CENTS",
        100_000_000,
        "refund batch: ceiling on the amount per batch, per currency, in minor units",
        ge=0,
    )
    daily_invoices: str | None = var(
        "DURABLE_DAILY_INVOICES",
        None,
        "the daily refund schedule's input file, `{date}` templated",
        unset="unset = synthetic",
    )
