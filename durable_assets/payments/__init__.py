"""Payment providers: the embedded one, a Stripe-compatible API, and the gateway seam.

The HTTP simulator (``job provider serve``) is development tooling: it lives in
:mod:`durable_assets_testing.simulator`, which nothing here imports.
"""

from durable_assets.payments.gateway import (
    BalanceTransaction,
    Charge,
    Customer,
    CustomerGateway,
    EmbeddedGateway,
    Refund,
    RefundGateway,
    StripeGateway,
    gateway_from_settings,
)
from durable_assets.payments.params import StripeApiError
from durable_assets.payments.store import PaymentStore

__all__ = [
    "BalanceTransaction",
    "Charge",
    "Customer",
    "CustomerGateway",
    "EmbeddedGateway",
    "PaymentStore",
    "Refund",
    "RefundGateway",
    "StripeApiError",
    "StripeGateway",
    "gateway_from_settings",
]
