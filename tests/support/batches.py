"""What a synthetic batch must refund, recomputed from its id alone.

The crash tier and the benchmark both check a batch's refunds against something the worker under
test did not compute: the pure generator, validation and policy, run again in the checking process.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import pandas as pd


def synthetic_candidates(batch_id: str, size: int) -> pd.DataFrame:
    """The refund candidates of synthetic batch ``batch_id`` of ``size`` invoices (one row each:
    invoice_id, reason, refund_cents, customer_email, ...), as the pipeline's policy step makes them."""
    from durable_assets.refunds.policy import compute_refund_candidates
    from durable_assets.refunds.synthetic import synthetic_invoices
    from durable_assets.refunds.validation import validate_invoices

    valid = validate_invoices(synthetic_invoices(batch_id, size), require_charge_id=False).valid
    return compute_refund_candidates(valid)
