"""Resources of the credit migration: its money limits."""

from __future__ import annotations

from pydantic import Field

from durable_assets.kit import Guardrails


class CreditLimits(Guardrails):
    """Per-batch ceilings on the balances a migration may move: a wrong export (credit in cents
    read as units, a duplicated file) cannot hand out unbounded credit. Amounts are the sum of
    the adjustments' absolute values, per currency. Pinned with the batch at its first run
    (``Guardrails``): a resume from another shell keeps them."""

    env_vars = {
        "max_adjustments_per_batch": "DURABLE_MAX_CREDIT_ADJUSTMENTS_PER_BATCH",
        "max_credit_per_batch_cents": "DURABLE_MAX_CREDIT_PER_BATCH_CENTS",
    }

    max_adjustments_per_batch: int = Field(default=100_000, ge=0)
    max_credit_per_batch_cents: int = Field(
        default=100_000_000, ge=0, description="Per currency, in minor units (default 1,000,000.00)"
    )
