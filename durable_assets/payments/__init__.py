"""Payment providers: the embedded one, the Stripe-compatible simulator, and the gateway seam."""

from durable_assets.payments.embedded import EmbeddedProvider
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
from durable_assets.payments.simulator import SimulatorServer, build_server, serve
from durable_assets.payments.store import PaymentStore, StripeApiError

__all__ = [
    "BalanceTransaction",
    "Charge",
    "Customer",
    "CustomerGateway",
    "EmbeddedGateway",
    "EmbeddedProvider",
    "PaymentStore",
    "Refund",
    "RefundGateway",
    "SimulatorServer",
    "StripeApiError",
    "StripeGateway",
    "build_server",
    "gateway_from_settings",
    "serve",
]
