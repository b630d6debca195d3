"""The seam the pipelines talk to (refunds; customers and their balances), and its two
implementations. One concern per module: :mod:`.models` (the values and the two seams),
:mod:`.template` (requests, answers checked, pages read, for both transports), :mod:`.answers`
(parsing and checking what the provider said), :mod:`.failures` (its failures as our errors),
:mod:`.embedded` and :mod:`.stripe_sdk` (the two transports); this module picks one.

The pipelines must not care whether effects go to the embedded provider or over HTTP to a
Stripe-compatible API: both gateways share one template (:class:`GatewayTemplate`) that builds every
request, validates every answer and reads every page. Only the transport differs (one primitive
per endpoint: the store's method, or the SDK's), and both map failures onto
:mod:`durable_assets.errors` through :func:`provider_error`, so a retry policy written against one
behaves identically against the other.

Everything the provider answers is checked against what was asked (amount, currency, charge,
customer, idempotency key) and anything that does not match raises
:class:`~durable_assets.errors.ProviderResponseMismatchError`: for money, failing closed is the
only safe reaction to an answer we do not understand.
"""

from __future__ import annotations

from durable_assets.errors import ProviderConfigError
from durable_assets.payments.gateway.answers import is_live_key, parse_account_id
from durable_assets.payments.gateway.embedded import EmbeddedGateway
from durable_assets.payments.gateway.models import (
    DEFAULT_PAGE_SIZE,
    DURABLE_REASON_METADATA,
    IDEMPOTENCY_KEY_METADATA,
    BalanceTransaction,
    Charge,
    Customer,
    CustomerGateway,
    PageSender,
    Refund,
    RefundGateway,
    send_at_once,
)
from durable_assets.payments.gateway.stripe_sdk import StripeGateway

__all__ = [
    "DEFAULT_PAGE_SIZE",
    "DURABLE_REASON_METADATA",
    "IDEMPOTENCY_KEY_METADATA",
    "BalanceTransaction",
    "Charge",
    "Customer",
    "CustomerGateway",
    "EmbeddedGateway",
    "PageSender",
    "Refund",
    "RefundGateway",
    "StripeGateway",
    "gateway_from_settings",
    "is_live_key",
    "parse_account_id",
    "send_at_once",
]


def gateway_from_settings(
    payments_url: str | None, api_key: str | None, embedded_path: str
) -> EmbeddedGateway | StripeGateway:
    """``DURABLE_PAYMENTS_URL`` unset means the embedded provider, per docs/contract.md. Either gateway
    is both a :class:`RefundGateway` and a :class:`CustomerGateway`."""
    if not payments_url:
        return EmbeddedGateway(embedded_path)
    if not api_key:
        raise ProviderConfigError(
            "DURABLE_PAYMENTS_URL is set but STRIPE_API_KEY is not: set the provider's API key "
            "(for the simulator, any sk_test_ key unless it was started with --api-key), "
            "or unset DURABLE_PAYMENTS_URL to use the embedded provider."
        )
    return StripeGateway(payments_url, api_key)
