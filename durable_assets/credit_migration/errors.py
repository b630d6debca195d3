"""The credit migration's own conditions, in the kit's one hierarchy."""

from __future__ import annotations

from durable_assets.errors import GuardrailError


class CreditCeilingExceededError(GuardrailError):
    """The batch's adjustments would exceed the per-batch count or amount ceiling
    (``DURABLE_MAX_CREDIT_ADJUSTMENTS_PER_BATCH``, ``DURABLE_MAX_CREDIT_PER_BATCH_CENTS``)."""
