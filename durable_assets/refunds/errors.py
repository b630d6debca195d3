"""The refund pipeline's own conditions, in the kit's one hierarchy."""

from __future__ import annotations

from durable_assets.errors import GuardrailError


class RefundCeilingExceededError(GuardrailError):
    """The batch's refunds would exceed the per-batch count or amount ceiling
    (``DURABLE_MAX_REFUNDS_PER_BATCH``, ``DURABLE_MAX_AMOUNT_PER_BATCH_CENTS``)."""


class RefundAboveRefundableError(GuardrailError):
    """A refund was about to be requested for more than the invoice's refundable amount."""
