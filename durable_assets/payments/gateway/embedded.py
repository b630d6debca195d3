"""The embedded transport: the provider's store, in this process, behind the same template."""

from __future__ import annotations

import dataclasses
import sqlite3
from collections.abc import Callable
from typing import Any

from durable_assets.payments.gateway.failures import provider_error
from durable_assets.payments.gateway.models import DEFAULT_PAGE_SIZE
from durable_assets.payments.gateway.template import (
    BalanceTransactionRequest,
    ChargeRequest,
    CustomerRequest,
    GatewayTemplate,
    RefundRequest,
)
from durable_assets.payments.params import JsonObject, StripeApiError
from durable_assets.payments.store import PaymentStore, StoreResult


class EmbeddedGateway(GatewayTemplate):
    """The in-instance provider behind the same seam; nothing to start. Its transport is the
    store itself, which holds every rule the HTTP simulator serves too."""

    def __init__(self, path: str, *, page_size: int = DEFAULT_PAGE_SIZE) -> None:
        # Never live: no real money moves here.
        super().__init__(page_size=page_size, provider="embedded", livemode=False)
        self._store = PaymentStore(path)

    def stats(self) -> dict[str, int]:
        return self._store.stats()

    def close(self) -> None:
        self._store.close()

    def _post_charge(self, request: ChargeRequest) -> object:
        return _store_create(self._store.create_charge, request)

    def _post_refund(self, request: RefundRequest) -> object:
        def counted(**fields: Any) -> StoreResult:
            self._store.record_refund_request()  # first, exactly where the HTTP front counts it
            return self._store.create_refund(**fields)

        return _store_create(counted, request)

    def _get_refund(self, refund_id: str) -> object:
        return _embedded_call(lambda: self._store.retrieve_refund(refund_id))

    def _list_refunds(self, charge: str, *, limit: int, starting_after: str | None) -> object:
        return _embedded_call(
            lambda: self._store.list_refunds(limit=limit, starting_after=starting_after, charge=charge)
        )

    def _post_customer(self, request: CustomerRequest) -> object:
        return _store_create(self._store.create_customer, request)

    def _get_customer(self, customer_id: str) -> object:
        return _embedded_call(lambda: self._store.retrieve_customer(customer_id))

    def _delete_customer(self, customer_id: str) -> object:
        return _embedded_call(lambda: self._store.delete_customer(customer_id))

    def _list_customers(self, *, limit: int, starting_after: str | None, email: str | None) -> object:
        return _embedded_call(
            lambda: self._store.list_customers(limit=limit, starting_after=starting_after, email=email)
        )

    def _post_balance_transaction(self, request: BalanceTransactionRequest) -> object:
        return _store_create(self._store.create_balance_transaction, request, positional=("customer_id",))

    def _get_balance_transaction(self, customer_id: str, transaction_id: str) -> object:
        return _embedded_call(lambda: self._store.retrieve_balance_transaction(customer_id, transaction_id))

    def _list_balance_transactions(
        self, customer_id: str, *, limit: int, starting_after: str | None
    ) -> object:
        return _embedded_call(
            lambda: self._store.list_balance_transactions(
                customer_id, limit=limit, starting_after=starting_after
            )
        )

    def _get_account(self) -> object:
        return _embedded_call(self._store.account)


def _store_create(
    create: Callable[..., StoreResult],
    request: ChargeRequest | RefundRequest | CustomerRequest | BalanceTransactionRequest,
    *,
    positional: tuple[str, ...] = (),
) -> JsonObject:
    """One creation in the store, under the request's idempotency key.

    Why the request whole: the template built it once for both transports, and its fields are
    the store method's parameters of the same names (``positional``: those the method takes by
    position, in order), so the embedded transport has nothing to translate.
    """
    fields = dataclasses.asdict(request)
    args = [fields.pop(name) for name in positional]
    return _embedded_call(lambda: create(*args, **fields).body, request.idempotency_key)


def _embedded_call(request: Callable[[], JsonObject], idempotency_key: str | None = None) -> JsonObject:
    """A locked-out database is the embedded twin of a 5xx: nothing committed, safe to retry."""
    try:
        return request()
    except StripeApiError as error:
        raise provider_error(
            http_status=error.http_status,
            error_type=error.error_type,
            code=error.code,
            message=error.message,
            idempotency_key=idempotency_key,
        ) from error
    except sqlite3.OperationalError as error:
        raise provider_error(
            http_status=None, error_type=None, code="database_unavailable", message=str(error)
        ) from error
