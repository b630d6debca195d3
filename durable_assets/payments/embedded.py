"""The in-instance payment provider: the simulator's store without HTTP.

Used when ``DURABLE_PAYMENTS_URL`` is unset, so a pipeline runs with nothing to start. It is
deliberately thin: every rule lives in :class:`PaymentStore`, which the HTTP simulator uses too,
so switching fronts never changes what a refund request does or how it is counted.

Customers and balance transactions have no forwarding methods here: nothing is counted before
them, so :class:`~durable_assets.payments.gateway.EmbeddedGateway` calls the store's typed
methods directly (``provider.store``) rather than through one more layer of the same keywords.
"""

from __future__ import annotations

from collections.abc import Mapping

from durable_assets.payments.store import JsonObject, PaymentStore


class EmbeddedProvider:
    """Stripe-shaped answers (dicts) and :class:`StripeApiError` failures, like the HTTP front."""

    def __init__(self, path: str) -> None:
        self._store = PaymentStore(path)

    @property
    def store(self) -> PaymentStore:
        return self._store

    def create_charge(
        self,
        *,
        amount: int,
        currency: str,
        customer: str | None = None,
        description: str | None = None,
        metadata: Mapping[str, str] | None = None,
        idempotency_key: str | None = None,
    ) -> JsonObject:
        return self._store.create_charge(
            amount=amount,
            currency=currency,
            customer=customer,
            description=description,
            metadata=metadata,
            idempotency_key=idempotency_key,
        )

    def create_refund(
        self,
        *,
        charge: str,
        amount: int | None = None,
        reason: str | None = None,
        metadata: Mapping[str, str] | None = None,
        idempotency_key: str | None = None,
    ) -> JsonObject:
        """Counts the request first, exactly where the HTTP front counts it."""
        self._store.record_refund_request()
        return self._store.create_refund(
            charge=charge, amount=amount, reason=reason, metadata=metadata, idempotency_key=idempotency_key
        )

    def retrieve_refund(self, refund_id: str) -> JsonObject:
        return self._store.retrieve_refund(refund_id)

    def list_refunds(
        self, *, limit: int = 10, starting_after: str | None = None, charge: str | None = None
    ) -> JsonObject:
        return self._store.list_refunds(limit=limit, starting_after=starting_after, charge=charge)

    def stats(self) -> dict[str, int]:
        return self._store.stats()

    def close(self) -> None:
        self._store.close()
