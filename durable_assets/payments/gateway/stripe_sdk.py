"""The Stripe transport: a Stripe-compatible API through the official SDK."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import Any

import requests
import stripe
from stripe import RequestOptions
from stripe.params import (
    CustomerBalanceTransactionListParams,
    CustomerListParams,
    RefundListParams,
)

from durable_assets.errors import DurableError, TransientProviderError
from durable_assets.payments.gateway.answers import is_live_key, mismatch
from durable_assets.payments.gateway.failures import parse_retry_after, provider_error
from durable_assets.payments.gateway.models import DEFAULT_PAGE_SIZE
from durable_assets.payments.gateway.template import (
    BalanceTransactionRequest,
    ChargeRequest,
    CustomerRequest,
    GatewayTemplate,
    RefundRequest,
)


class StripeGateway(GatewayTemplate):
    """A Stripe-compatible API through the official SDK.

    The SDK's own retries are off (``max_network_retries=0``): retrying is the caller's decision,
    made with the same idempotency key and visible in its ledger. ``RequestsClient`` keeps one
    keep-alive session per thread, which makes the gateway safe and fast from many threads.
    Unset fields are left out of the parameters, not sent as None: the SDK would send an empty value.
    """

    def __init__(
        self, base_url: str, api_key: str, timeout_s: float = 10.0, *, page_size: int = DEFAULT_PAGE_SIZE
    ) -> None:
        # The mode is the key's, as at Stripe (one account, two modes).
        super().__init__(page_size=page_size, provider="stripe", livemode=is_live_key(api_key))
        self._base_url = base_url.rstrip("/")
        self._timeout_s = timeout_s
        self._http = stripe.RequestsClient(timeout=timeout_s)
        self._client = stripe.StripeClient(
            api_key,
            base_addresses={"api": self._base_url},
            max_network_retries=0,
            http_client=self._http,
        )

    def close(self) -> None:
        """Closes this thread's keep-alive session (other threads' close with their threads)."""
        self._http.close()

    def stats(self) -> dict[str, int]:
        """The simulator's counters (``GET /_sim/stats``); real Stripe has no such route."""
        try:
            response = requests.get(f"{self._base_url}/_sim/stats", timeout=self._timeout_s)
            response.raise_for_status()
            return {str(name): int(value) for name, value in response.json().items()}
        except (requests.RequestException, ValueError, AttributeError) as error:
            raise TransientProviderError(f"Payment simulator stats unavailable: {error}") from error

    def _post_charge(self, request: ChargeRequest) -> object:
        return _sdk_create(self._client.v1.charges.create, request)

    def _post_refund(self, request: RefundRequest) -> object:
        return _sdk_create(self._client.v1.refunds.create, request)

    def _get_refund(self, refund_id: str) -> object:
        return _sdk_call(lambda: self._client.v1.refunds.retrieve(refund_id))

    def _list_refunds(self, charge: str, *, limit: int, starting_after: str | None) -> object:
        params: RefundListParams = {"charge": charge, "limit": limit}
        if starting_after is not None:
            params["starting_after"] = starting_after
        return _sdk_call(lambda: self._client.v1.refunds.list(params=params))

    def _post_customer(self, request: CustomerRequest) -> object:
        return _sdk_create(self._client.v1.customers.create, request)

    def _get_customer(self, customer_id: str) -> object:
        return _sdk_call(lambda: self._client.v1.customers.retrieve(customer_id))

    def _delete_customer(self, customer_id: str) -> object:
        return _sdk_call(lambda: self._client.v1.customers.delete(customer_id))

    def _list_customers(self, *, limit: int, starting_after: str | None, email: str | None) -> object:
        params: CustomerListParams = {"limit": limit}
        if starting_after is not None:
            params["starting_after"] = starting_after
        if email is not None:
            params["email"] = email
        return _sdk_call(lambda: self._client.v1.customers.list(params=params))

    def _post_balance_transaction(self, request: BalanceTransactionRequest) -> object:
        return _sdk_create(
            self._client.v1.customers.balance_transactions.create, request, positional=("customer_id",)
        )

    def _get_balance_transaction(self, customer_id: str, transaction_id: str) -> object:
        return _sdk_call(
            lambda: self._client.v1.customers.balance_transactions.retrieve(customer_id, transaction_id)
        )

    def _list_balance_transactions(
        self, customer_id: str, *, limit: int, starting_after: str | None
    ) -> object:
        params: CustomerBalanceTransactionListParams = {"limit": limit}
        if starting_after is not None:
            params["starting_after"] = starting_after
        return _sdk_call(
            lambda: self._client.v1.customers.balance_transactions.list(customer_id, params=params)
        )

    def _get_account(self) -> object:
        return _sdk_call(self._client.v1.accounts.retrieve_current)


def _sdk_create(
    create: Callable[..., stripe.StripeObject],
    request: ChargeRequest | RefundRequest | CustomerRequest | BalanceTransactionRequest,
    *,
    positional: tuple[str, ...] = (),
) -> object:
    """One creation through the SDK: the request's fields are Stripe's parameters of the same
    names (``positional``: those the call takes by position, in order), its key the request option.

    Why one place: unset fields (None) are left out, not sent (the SDK would send an empty value,
    which Stripe reads as "unset this"), and that rule holds for every creation alike.
    """
    fields = {name: value for name, value in dataclasses.asdict(request).items() if value is not None}
    key = fields.pop("idempotency_key")
    args = [fields.pop(name) for name in positional]
    return _sdk_call(lambda: create(*args, params=fields, options=_keyed(key)), key)


def _keyed(idempotency_key: str) -> RequestOptions:
    return {"idempotency_key": idempotency_key}


def _sdk_call(request: Callable[[], stripe.StripeObject], idempotency_key: str | None = None) -> object:
    try:
        answer = request()
    except stripe.APIConnectionError as error:
        raise provider_error(
            http_status=None,
            error_type=None,
            code="connection_error",
            message=f"no answer from DURABLE_PAYMENTS_URL ({_network_cause(error)})",
            idempotency_key=idempotency_key,
        ) from error
    except stripe.StripeError as error:
        raise _from_stripe_error(error, idempotency_key) from error
    try:
        return answer.to_dict()
    except Exception as error:  # the SDK built something we cannot read: outcome unknown
        raise mismatch("an unreadable object", answer) from error


def _from_stripe_error(error: stripe.StripeError, idempotency_key: str | None) -> DurableError:
    body = error.json_body if isinstance(error.json_body, dict) else {}
    raw_details = body.get("error")
    details: dict[str, Any] = raw_details if isinstance(raw_details, dict) else {}
    return provider_error(
        http_status=error.http_status,
        error_type=details.get("type"),
        code=details.get("code") or error.code,
        message=str(details.get("message") or _one_line(error.user_message or str(error))),
        retry_after=parse_retry_after(_header(error.headers, "Retry-After")),
        idempotency_key=idempotency_key,
    )


def _header(headers: Mapping[str, str] | None, name: str) -> str | None:
    for key, value in (headers or {}).items():
        if key.lower() == name.lower():
            return value
    return None


def _network_cause(error: stripe.APIConnectionError) -> str:
    """Keeps the SDK's "(Network error: ...)" detail and drops its advice to email Stripe support."""
    text = _one_line(error.user_message or str(error))
    _, marker, cause = text.partition("(Network error: ")
    return cause.rstrip(")") if marker else text


def _one_line(text: str) -> str:
    """The SDK's messages are wrapped paragraphs; errors.py messages are single lines."""
    return " ".join(text.split())[:500] or "unknown error"
