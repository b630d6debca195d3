"""Resources of the credit migration: its money limits."""

from __future__ import annotations

from dagster import ConfigurableResource
from pydantic import Field


class CreditLimits(ConfigurableResource):
    """Per-batch ceilings on the balances a migration may move: a wrong export (credit in cents
    read as units, a duplicated file) cannot hand out unbounded credit. Amounts are the sum of
    the adjustments' absolute values, per currency."""

    max_adjustments_per_batch: int = Field(default=100_000, ge=0)
    max_credit_per_batch_cents: int = Field(
        default=100_000_000, ge=0, description="Per currency, in minor units (default 1,000,000.00)"
    )
