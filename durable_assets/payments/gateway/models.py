"""Values the gateways answer with, and the two seams the pipelines call (refunds; customers and
their balances).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Literal, Protocol

from durable_assets.kit.runtime import ProviderAccount

#: Metadata keys the gateways own; callers may not set them to something else.
IDEMPOTENCY_KEY_METADATA = "idempotency_key"
DURABLE_REASON_METADATA = "durable_reason"
DEFAULT_PAGE_SIZE = 100

StripeReason = Literal["duplicate", "requested_by_customer"]


#: Makes one page's request: ``send(request)`` returns ``request()``'s answer, e.g. paced and retried.
PageSender = Callable[[Callable[[], object]], object]


def send_at_once(request: Callable[[], object]) -> object:
    """The default :data:`PageSender`: the request, unpaced (callers that pace wrap it)."""
    return request()


@dataclass(frozen=True)
class Charge:
    id: str
    amount: int
    currency: str
    amount_refunded: int
    status: str
    metadata: dict[str, str] = field(default_factory=dict, hash=False)


@dataclass(frozen=True)
class Refund:
    id: str
    amount: int
    currency: str
    charge_id: str
    status: str
    reason: str | None
    metadata: dict[str, str] = field(default_factory=dict, hash=False)

    @property
    def idempotency_key(self) -> str | None:
        """The key is kept in metadata because providers forget idempotency keys (Stripe: 24 h)."""
        return self.metadata.get(IDEMPOTENCY_KEY_METADATA)

    @property
    def durable_reason(self) -> str | None:
        """Our own reason; Stripe's ``reason`` enum is too coarse to carry it."""
        return self.metadata.get(DURABLE_REASON_METADATA)


class RefundGateway(Protocol):
    """What the refund step needs from a payment provider. Implementations are thread-safe."""

    def create_charge(
        self, *, amount: int, currency: str, customer: str, metadata: dict[str, str], idempotency_key: str
    ) -> Charge: ...

    def create_refund(
        self,
        *,
        charge_id: str,
        amount: int,
        currency: str,
        reason: str,
        metadata: dict[str, str],
        idempotency_key: str,
    ) -> Refund: ...

    def retrieve_refund(self, refund_id: str) -> Refund: ...

    def find_refund_by_key(self, *, charge_id: str, idempotency_key: str) -> Refund | None: ...

    def list_charge_refunds(self, charge_id: str) -> list[Refund]: ...


@dataclass(frozen=True)
class Customer:
    """``deleted``: deleted at the provider, which still answers its id (Stripe's ``deleted: true``)
    but nothing else about it; every other field is then empty."""

    id: str
    email: str | None
    name: str | None
    balance: int
    currency: str | None
    metadata: dict[str, str] = field(default_factory=dict, hash=False)
    deleted: bool = False

    @property
    def idempotency_key(self) -> str | None:
        return self.metadata.get(IDEMPOTENCY_KEY_METADATA)


@dataclass(frozen=True)
class BalanceTransaction:
    """A customer balance transaction; ``amount < 0`` is credit owed to the customer (Stripe's sign)."""

    id: str
    customer_id: str
    amount: int
    currency: str
    ending_balance: int
    description: str | None
    type: str
    metadata: dict[str, str] = field(default_factory=dict, hash=False)

    @property
    def idempotency_key(self) -> str | None:
        """Kept in metadata, as for refunds, so a transaction is found again after the provider
        has forgotten the key."""
        return self.metadata.get(IDEMPOTENCY_KEY_METADATA)


class CustomerGateway(Protocol):
    """What the credit migration needs from a payment provider. Implementations are thread-safe.

    Creations take an idempotency key, which also goes to the object's ``metadata`` under
    ``idempotency_key``; lists read every page.
    """

    def create_customer(
        self, *, email: str | None, name: str | None, metadata: dict[str, str], idempotency_key: str
    ) -> Customer: ...

    def retrieve_customer(self, customer_id: str) -> Customer:
        """The customer; a deleted one is returned (``deleted=True``), not raised."""
        ...

    def delete_customer(self, customer_id: str) -> Customer:
        """Deletes at the provider; answers the deleted customer. Deleting it again is a 404."""
        ...

    def list_customers(
        self, *, email: str | None = None, send: PageSender = send_at_once, max_pages: int | None = None
    ) -> list[Customer]:
        """Every live customer, newest first, with its ``balance`` and ``currency``: one request per
        page of up to 100. ``send`` makes each page's request (a paced, retried call), so a 429 on
        one page repeats that page, not the listing. ``max_pages``: only the newest customers, as
        many as that many pages hold (for a reader that asks for the rest one by one)."""
        ...

    @property
    def page_size(self) -> int:
        """Items per page of every list (Stripe's largest, 100, unless a test asks for fewer)."""
        ...

    def customers_page(
        self, *, starting_after: str | None, send: PageSender = send_at_once
    ) -> tuple[list[Customer], bool]:
        """One page of the list (up to 100 live customers, newest first) after ``starting_after``,
        and whether older ones follow: for a reader that knows its cursors before it asks."""
        ...

    def find_customer(
        self, *, metadata_key: str, value: str, email: str | None = None
    ) -> Customer | None: ...

    def create_balance_transaction(
        self,
        *,
        customer_id: str,
        amount: int,
        currency: str,
        description: str | None,
        metadata: dict[str, str],
        idempotency_key: str,
    ) -> BalanceTransaction: ...

    def list_balance_transactions(self, customer_id: str) -> list[BalanceTransaction]: ...

    def retrieve_balance_transaction(self, customer_id: str, transaction_id: str) -> BalanceTransaction: ...

    def latest_balance_transaction(self, customer_id: str) -> BalanceTransaction | None:
        """The customer's newest balance transaction (one request), or None if it has none: its id
        names the balance's current version, its ``ending_balance`` is the balance."""
        ...

    def account(self) -> ProviderAccount:
        """The provider account this gateway talks to: the ledger namespaces every key by it."""
        ...
