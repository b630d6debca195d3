"""The credit migration's own variables: its guardrails' ceilings and the nightly schedule's input.

Declared by the pipeline that uses them; read where the code location is wired
(durable_assets/definitions.py), which gives them to :class:`CreditLimits`.
"""

from __future__ import annotations

from durable_assets.settings import Section, var


class CreditMigrationSettings(Section):
    """The credit migration's limits and nightly input."""

    max_adjustments_per_batch: int = var(
        "DURABLE_MAX_CREDIT_ADJUSTMENTS_PER_BATCH",
        100_000,
        "credit migration: ceiling on balance adjustments per batch",
        ge=0,
    )
    max_credit_per_batch_cents: int = var(
        "DURABLE_MAX_CREDIT_PER_BATCH_CENTS",
        100_000_000,
        "credit migration: ceiling on the credit a batch moves (sum of the adjustments' absolute "
        "values), per currency, in minor units",
        ge=0,
    )
    nightly_credits: str | None = var(
        "DURABLE_NIGHTLY_CREDITS",
        None,
        "the nightly credit-migration schedule's input file, `{date}` templated",
        unset="unset = synthetic",
    )
