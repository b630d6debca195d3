"""The shared template: builds every request, validates every answer and reads every page; a
transport supplies one primitive per endpoint (:mod:`.embedded`, :mod:`.stripe_sdk`).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from typing import TypeVar

from durable_assets.errors import ProviderResponseMismatchError, UsageError
from durable_assets.kit.runtime import ProviderAccount
from durable_assets.payments.gateway.answers import (
    IdentifiedT,
    every_page,
    expect,
    list_items,
    parse_account_id,
    parse_balance_transaction,
    parse_charge,
    parse_customer,
    parse_refund,
)
from durable_assets.payments.gateway.models import (
    DURABLE_REASON_METADATA,
    IDEMPOTENCY_KEY_METADATA,
    BalanceTransaction,
    Charge,
    Customer,
    PageSender,
    Refund,
    StripeReason,
    send_at_once,
)


def stripe_reason(reason: str) -> StripeReason:
    """Stripe accepts only duplicate|fraudulent|requested_by_customer; ours goes to metadata."""
    return "duplicate" if reason == "duplicate_charge" else "requested_by_customer"


def with_owned_metadata(metadata: Mapping[str, str], owned: Mapping[str, str]) -> dict[str, str]:
    """Adds the keys the gateway owns; a caller value that disagrees is a bug, not a preference."""
    for name, value in owned.items():
        if name in metadata and metadata[name] != value:
            raise UsageError(
                f"metadata[{name!r}] is set by the payment gateway; "
                f"got {metadata[name]!r}, expected {value!r}."
            )
    return {**metadata, **owned}


# --- the shared template -------------------------------------------------------------------------


def _at_most_one(matches: list[IdentifiedT], violation: Callable[[str], str]) -> IdentifiedT | None:
    """The one match, or None; two or more mean an exactly-once guarantee broke upstream, which is
    reported (``violation`` of their ids) instead of silently picking one."""
    if len(matches) > 1:
        raise ProviderResponseMismatchError(violation(", ".join(match.id for match in matches)))
    return matches[0] if matches else None


def _first_item(body: object, parse: Callable[[object], IdentifiedT]) -> IdentifiedT | None:
    """The first item of one list page (newest first), or None for an empty list."""
    items, _has_more = list_items(body)
    return parse(items[0]) if items else None


@dataclass(frozen=True, kw_only=True)
class _Creation:
    """What every creation sends besides its fields: the caller's metadata with the gateway's own
    keys added (the idempotency key, found again there once the provider forgets it), and the key."""

    metadata: dict[str, str]
    idempotency_key: str


#: The request of one ``create_*``, and what its answer parses to (:meth:`GatewayTemplate._create`).
RequestT = TypeVar("RequestT", bound=_Creation)
CreatedT = TypeVar("CreatedT")


@dataclass(frozen=True, kw_only=True)
class ChargeRequest(_Creation):
    amount: int
    currency: str  # lowercased, as the provider answers it
    customer: str


@dataclass(frozen=True, kw_only=True)
class RefundRequest(_Creation):
    """Stripe's coarse ``reason``; ours travels in ``metadata``."""

    charge: str
    amount: int
    reason: StripeReason


@dataclass(frozen=True, kw_only=True)
class CustomerRequest(_Creation):
    email: str | None
    name: str | None


@dataclass(frozen=True, kw_only=True)
class BalanceTransactionRequest(_Creation):
    customer_id: str
    amount: int  # negative: credit owed to the customer
    currency: str
    description: str | None


class GatewayTemplate(ABC):
    """Request building, answer validation and pagination, once for both providers; subclasses
    supply only transport: one primitive per endpoint, answering the provider's JSON object."""

    def __init__(self, *, page_size: int, provider: str, livemode: bool) -> None:
        if not 1 <= page_size <= 100:
            raise UsageError(f"page_size must be 1..100, got {page_size}.")
        self._page_size = page_size
        self._provider = provider
        self._livemode = livemode

    def _create(
        self,
        post: Callable[[RequestT], object],
        request: RequestT,
        parse: Callable[[object], CreatedT],
        echoes: Callable[[CreatedT], list[tuple[str, object, object]]],
        *,
        owned: Mapping[str, str] | None = None,
    ) -> CreatedT:
        """Every ``create_*``: one request sent, and its answer checked before it is believed.

        The gateway's own metadata keys (the idempotency key, and ``owned``) are added to the
        caller's, refusing a caller value that disagrees before anything is sent; the answer is
        parsed, and each ``(what, answered, asked)`` of ``echoes`` must agree, so an answer to some
        other request fails closed instead of being recorded as this one's. Written once so that no
        creation can skip a step of it.
        """
        keys = {IDEMPOTENCY_KEY_METADATA: request.idempotency_key, **(owned or {})}
        body = post(replace(request, metadata=with_owned_metadata(request.metadata, keys)))
        created = parse(body)
        for what, answered, asked in echoes(created):
            expect(body, what, answered, asked)
        return created

    # charges and refunds

    def create_charge(
        self, *, amount: int, currency: str, customer: str, metadata: dict[str, str], idempotency_key: str
    ) -> Charge:
        currency = currency.lower()
        request = ChargeRequest(
            amount=amount,
            currency=currency,
            customer=customer,
            metadata=metadata,
            idempotency_key=idempotency_key,
        )
        return self._create(
            self._post_charge,
            request,
            parse_charge,
            lambda charge: [
                ("a charge amount of", charge.amount, amount),
                ("a charge currency of", charge.currency, currency),
                ("a charge key of", charge.metadata.get(IDEMPOTENCY_KEY_METADATA), idempotency_key),
            ],
        )

    def create_refund(
        self,
        *,
        charge_id: str,
        amount: int,
        currency: str,
        reason: str,
        metadata: dict[str, str],
        idempotency_key: str,
    ) -> Refund:
        """``currency`` is not sent (Stripe refunds inherit the charge's); it is checked on the answer."""
        request = RefundRequest(
            charge=charge_id,
            amount=amount,
            reason=stripe_reason(reason),
            metadata=metadata,
            idempotency_key=idempotency_key,
        )
        return self._create(
            self._post_refund,
            request,
            parse_refund,
            lambda refund: [
                ("a refund of charge", refund.charge_id, charge_id),
                ("a refund amount of", refund.amount, amount),
                ("a refund currency of", refund.currency, currency.lower()),
                ("a refund key of", refund.idempotency_key, idempotency_key),
            ],
            owned={DURABLE_REASON_METADATA: reason},
        )

    def retrieve_refund(self, refund_id: str) -> Refund:
        body = self._get_refund(refund_id)
        refund = parse_refund(body)
        expect(body, "refund", refund.id, refund_id)
        return refund

    def list_charge_refunds(self, charge_id: str) -> list[Refund]:
        """Every refund of a charge, all pages read; a refund of another charge fails closed."""

        def of_this_charge(item: object) -> Refund:
            refund = parse_refund(item)
            expect(item, "a refund of charge", refund.charge_id, charge_id)
            return refund

        return every_page(
            lambda after: self._list_refunds(charge_id, limit=self._page_size, starting_after=after),
            of_this_charge,
        )

    def find_refund_by_key(self, *, charge_id: str, idempotency_key: str) -> Refund | None:
        """Reads every page, so a second refund with the same key (a broken exactly-once
        guarantee) is reported instead of silently picking one."""
        matches = [r for r in self.list_charge_refunds(charge_id) if r.idempotency_key == idempotency_key]
        return _at_most_one(
            matches,
            lambda ids: (
                f"Charge {charge_id} has {len(matches)} refunds with idempotency key "
                f"{idempotency_key!r} ({ids}); exactly-once was violated upstream. Investigate before "
                "refunding anything else."
            ),
        )

    # customers and their balances

    def create_customer(
        self, *, email: str | None, name: str | None, metadata: dict[str, str], idempotency_key: str
    ) -> Customer:
        return self._create(
            self._post_customer,
            CustomerRequest(email=email, name=name, metadata=metadata, idempotency_key=idempotency_key),
            parse_customer,
            lambda customer: [
                ("a customer email of", customer.email, email),
                ("a customer name of", customer.name, name),
                ("a customer key of", customer.idempotency_key, idempotency_key),
            ],
        )

    def retrieve_customer(self, customer_id: str) -> Customer:
        """The customer; a deleted one is returned (``deleted=True``), not raised."""
        return parse_customer(self._get_customer(customer_id))

    def delete_customer(self, customer_id: str) -> Customer:
        """Deletes at the provider; answers the deleted customer. Deleting it again is a 404."""
        body = self._delete_customer(customer_id)
        customer = parse_customer(body)
        expect(body, "a deleted customer", customer.id, customer_id)
        expect(body, "a customer deleted flag of", customer.deleted, True)
        return customer

    def list_customers(
        self, *, email: str | None = None, send: PageSender = send_at_once, max_pages: int | None = None
    ) -> list[Customer]:
        return every_page(
            lambda after: send(
                lambda: self._list_customers(limit=self._page_size, starting_after=after, email=email)
            ),
            parse_customer,
            max_pages,
        )

    @property
    def page_size(self) -> int:
        return self._page_size

    def customers_page(
        self, *, starting_after: str | None, send: PageSender = send_at_once
    ) -> tuple[list[Customer], bool]:
        page = send(
            lambda: self._list_customers(limit=self._page_size, starting_after=starting_after, email=None)
        )
        raw, has_more = list_items(page)
        return [parse_customer(item) for item in raw], has_more

    def find_customer(self, *, metadata_key: str, value: str, email: str | None = None) -> Customer | None:
        """The one customer whose ``metadata[metadata_key] == value``, read from the list (narrowed
        by ``email`` when given). Not Stripe's search: it is eventually consistent, so a customer
        created a moment ago could be missed and created twice. Two matches fail closed."""
        matches = [
            customer
            for customer in self.list_customers(email=email)
            if customer.metadata.get(metadata_key) == value
        ]
        return _at_most_one(
            matches,
            lambda ids: (
                f"{len(matches)} customers have metadata {metadata_key}={value!r} ({ids}); "
                "exactly-once was violated upstream. Investigate before moving any balance."
            ),
        )

    def create_balance_transaction(
        self,
        *,
        customer_id: str,
        amount: int,
        currency: str,
        description: str | None,
        metadata: dict[str, str],
        idempotency_key: str,
    ) -> BalanceTransaction:
        currency = currency.lower()
        request = BalanceTransactionRequest(
            customer_id=customer_id,
            amount=amount,
            currency=currency,
            description=description,
            metadata=metadata,
            idempotency_key=idempotency_key,
        )
        return self._create(
            self._post_balance_transaction,
            request,
            parse_balance_transaction,
            lambda transaction: [
                ("a balance transaction of customer", transaction.customer_id, customer_id),
                ("a balance transaction amount of", transaction.amount, amount),
                ("a balance transaction currency of", transaction.currency, currency),
                ("a balance transaction key of", transaction.idempotency_key, idempotency_key),
            ],
        )

    def list_balance_transactions(self, customer_id: str) -> list[BalanceTransaction]:
        return every_page(
            lambda after: self._list_balance_transactions(
                customer_id, limit=self._page_size, starting_after=after
            ),
            parse_balance_transaction,
        )

    def retrieve_balance_transaction(self, customer_id: str, transaction_id: str) -> BalanceTransaction:
        body = self._get_balance_transaction(customer_id, transaction_id)
        transaction = parse_balance_transaction(body)
        expect(body, "balance transaction", transaction.id, transaction_id)
        expect(body, "a balance transaction of customer", transaction.customer_id, customer_id)
        return transaction

    def latest_balance_transaction(self, customer_id: str) -> BalanceTransaction | None:
        """The customer's newest balance transaction (one request), or None if it has none."""
        body = self._list_balance_transactions(customer_id, limit=1, starting_after=None)
        return _first_item(body, parse_balance_transaction)

    def account(self) -> ProviderAccount:
        """The account's ``acct_`` id as the provider answers it (the embedded store's own id, made
        with its file); live only for a Stripe live key, as at Stripe (one account, two modes)."""
        return ProviderAccount(self._provider, parse_account_id(self._get_account()), livemode=self._livemode)

    # transport, implemented by subclasses; each answers the provider's JSON object (a dict) or
    # raises the failure already mapped by provider_error

    @abstractmethod
    def _post_charge(self, request: ChargeRequest) -> object: ...

    @abstractmethod
    def _post_refund(self, request: RefundRequest) -> object: ...

    @abstractmethod
    def _get_refund(self, refund_id: str) -> object: ...

    @abstractmethod
    def _list_refunds(self, charge: str, *, limit: int, starting_after: str | None) -> object: ...

    @abstractmethod
    def _post_customer(self, request: CustomerRequest) -> object: ...

    @abstractmethod
    def _get_customer(self, customer_id: str) -> object: ...

    @abstractmethod
    def _delete_customer(self, customer_id: str) -> object: ...

    @abstractmethod
    def _list_customers(self, *, limit: int, starting_after: str | None, email: str | None) -> object: ...

    @abstractmethod
    def _post_balance_transaction(self, request: BalanceTransactionRequest) -> object: ...

    @abstractmethod
    def _get_balance_transaction(self, customer_id: str, transaction_id: str) -> object: ...

    @abstractmethod
    def _list_balance_transactions(
        self, customer_id: str, *, limit: int, starting_after: str | None
    ) -> object: ...

    @abstractmethod
    def _get_account(self) -> object: ...
