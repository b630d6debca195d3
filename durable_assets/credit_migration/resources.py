"""Resources of the credit migration: its money limits."""

from __future__ import annotations

from durable_assets.credit_migration.settings import CreditMigrationSettings
from durable_assets.kit import Guardrails, amount_ceiling, count_ceiling


class CreditLimits(Guardrails):
    """Per-batch ceilings on the balances a migration may move: a wrong export (credit in cents
    read as units, a duplicated file) cannot hand out unbounded credit. Amounts are the sum of
    the adjustments' absolute values, per currency. Pinned with the batch at its first run
    (``Guardrails``): a resume from another shell keeps them."""

    env_vars = CreditMigrationSettings.variables_of("max_adjustments_per_batch", "max_credit_per_batch_cents")

    max_adjustments_per_batch: int = count_ceiling(CreditMigrationSettings().max_adjustments_per_batch)
    max_credit_per_batch_cents: int = amount_ceiling(CreditMigrationSettings().max_credit_per_batch_cents)
