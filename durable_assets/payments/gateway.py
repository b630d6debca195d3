"""The seam the pipelines talk to (refunds; customers and their balances), and its two
implementations.

The pipelines must not care whether effects go to the embedded provider or over HTTP to a
Stripe-compatible API: both gateways share one template (:class:`_GatewayBase`) that builds every
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

import email.utils
import math
import sqlite3
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol, TypeVar

import requests
import stripe
from stripe import RequestOptions
from stripe.params import (
    ChargeCreateParams,
    CustomerBalanceTransactionCreateParams,
    CustomerBalanceTransactionListParams,
    CustomerCreateParams,
    CustomerListParams,
    RefundCreateParams,
    RefundListParams,
)

from durable_assets.errors import (
    DurableError,
    IdempotencyKeyEndpointError,
    IdempotencyKeyInFlightError,
    IdempotencyKeyMismatchError,
    ProviderConfigError,
    ProviderRejectedError,
    ProviderResponseMismatchError,
    TransientProviderError,
    UsageError,
)
from durable_assets.kit.runtime import ProviderAccount
from durable_assets.payments.store import JsonObject, PaymentStore, StripeApiError

#: Metadata keys the gateways own; callers may not set them to something else.
IDEMPOTENCY_KEY_METADATA = "idempotency_key"
DURABLE_REASON_METADATA = "durable_reason"
DEFAULT_PAGE_SIZE = 100

StripeReason = Literal["duplicate", "requested_by_customer"]
_T = TypeVar("_T")


#: Makes one page's request: ``send(request)`` returns ``request()``'s answer, e.g. paced and retried.
PageSender = Callable[[Callable[[], object]], object]


def send_at_once(request: Callable[[], object]) -> object:
    """The default :data:`PageSender`: the request, unpaced (callers that pace wrap it)."""
    return request()


# --- values --------------------------------------------------------------------------------------


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


# --- request building ----------------------------------------------------------------------------


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


# --- failure mapping -----------------------------------------------------------------------------


#: How Stripe's 400 ``idempotency_error`` tells a key reused on another endpoint (it has no code).
_OTHER_ENDPOINT = "can only be used for the same endpoint"


def provider_error(
    *,
    http_status: int | None,
    error_type: str | None,
    code: str | None,
    message: str,
    retry_after: float | None = None,
    idempotency_key: str | None = None,
) -> DurableError:
    """One mapping for both gateways, so retry decisions never depend on the transport."""
    status = "no response" if http_status is None else f"HTTP {http_status}"
    detail = f"Payment provider: {message} ({status}"
    detail += f", code {code})" if code else ")"
    key = f" {idempotency_key!r}" if idempotency_key else ""
    retry = f"{detail}. Retry later with the same idempotency key{key}."
    if http_status == 409 and (code == "idempotency_key_in_use" or error_type == "idempotency_error"):
        return IdempotencyKeyInFlightError(retry)
    if http_status is None or http_status in (409, 429) or http_status >= 500:
        return TransientProviderError(retry, http_status=http_status, code=code, retry_after=retry_after)
    if error_type == "idempotency_error" and _OTHER_ENDPOINT in message:
        return IdempotencyKeyEndpointError(
            f"{detail}. The idempotency key{key} was first used on another endpoint; nothing was changed. "
            "A key must name one request: derive it from the business identity and the kind of effect."
        )
    if error_type == "idempotency_error":
        return IdempotencyKeyMismatchError(
            f"{detail}. The idempotency key{key} was first used with different parameters; nothing was "
            "changed. Keys and request parameters must both derive from business identity only."
        )
    if 400 <= http_status < 500:
        return ProviderRejectedError(
            f"{detail}. Retrying will not help; fix the request.", http_status=http_status, code=code
        )
    return ProviderResponseMismatchError(
        f"{detail}. Unexpected status; treating the outcome as unknown.", http_status=http_status, code=code
    )


def parse_retry_after(value: str | None) -> float | None:
    """Seconds (fractional allowed, as the simulator sends) or an HTTP date."""
    if not value:
        return None
    try:
        seconds = float(value)
    except ValueError:
        try:
            seconds = email.utils.parsedate_to_datetime(value).timestamp() - time.time()
        except (TypeError, ValueError):
            return None
    return max(0.0, seconds) if math.isfinite(seconds) else None


# --- response validation -------------------------------------------------------------------------


def _mismatch(what: str, body: object) -> ProviderResponseMismatchError:
    return ProviderResponseMismatchError(
        f"Payment provider answered with {what}; failing closed. Answer: {str(body)[:500]}"
    )


def _field(body: Mapping[str, Any], name: str, kind: type[_T]) -> _T:
    value = body.get(name)
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        raise _mismatch(f"a malformed {name!r}", body)
    return value


def _metadata(body: Mapping[str, Any]) -> dict[str, str]:
    raw = body.get("metadata")
    raw = {} if raw is None else raw
    if not isinstance(raw, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in raw.items()
    ):
        raise _mismatch("malformed metadata", body)
    return dict(raw)


def _object(body: object, kind: str) -> Mapping[str, Any]:
    if not isinstance(body, dict) or body.get("object") != kind:
        raise _mismatch(f"something that is not a {kind}", body)
    return body


def parse_refund(body: object) -> Refund:
    data = _object(body, "refund")
    charge = data.get("charge")
    charge_id = charge.get("id") if isinstance(charge, dict) else charge  # expanded or not
    reason = data.get("reason")
    if not isinstance(charge_id, str) or not (reason is None or isinstance(reason, str)):
        raise _mismatch("a refund without a valid charge or reason", body)
    return Refund(
        id=_field(data, "id", str),
        amount=_field(data, "amount", int),
        currency=_field(data, "currency", str),
        charge_id=charge_id,
        status=_field(data, "status", str),
        reason=reason,
        metadata=_metadata(data),
    )


def parse_charge(body: object) -> Charge:
    data = _object(body, "charge")
    return Charge(
        id=_field(data, "id", str),
        amount=_field(data, "amount", int),
        currency=_field(data, "currency", str),
        amount_refunded=_field(data, "amount_refunded", int),
        status=_field(data, "status", str),
        metadata=_metadata(data),
    )


def _expect(body: object, what: str, actual: object, expected: object) -> None:
    if actual != expected:
        raise _mismatch(f"{what} {actual!r} where {expected!r} was asked", body)


def _list_items(body: object) -> tuple[list[object], bool]:
    data = _object(body, "list")
    items = data.get("data")
    has_more = data.get("has_more")
    if not isinstance(items, list) or not isinstance(has_more, bool):
        raise _mismatch("a malformed list", body)
    return items, has_more


def _optional(body: Mapping[str, Any], name: str) -> str | None:
    value = body.get(name)
    if value is not None and not isinstance(value, str):
        raise _mismatch(f"a malformed {name!r}", body)
    return value


def parse_customer(body: object) -> Customer:
    data = _object(body, "customer")
    if data.get("deleted") is True:
        return Customer(
            id=_field(data, "id", str), email=None, name=None, balance=0, currency=None, deleted=True
        )
    return Customer(
        id=_field(data, "id", str),
        email=_optional(data, "email"),
        name=_optional(data, "name"),
        balance=_field(data, "balance", int),
        currency=_optional(data, "currency"),
        metadata=_metadata(data),
    )


def parse_balance_transaction(body: object) -> BalanceTransaction:
    data = _object(body, "customer_balance_transaction")
    customer = data.get("customer")
    customer_id = customer.get("id") if isinstance(customer, dict) else customer  # expanded or not
    if not isinstance(customer_id, str):
        raise _mismatch("a balance transaction without a valid customer", body)
    return BalanceTransaction(
        id=_field(data, "id", str),
        customer_id=customer_id,
        amount=_field(data, "amount", int),
        currency=_field(data, "currency", str),
        ending_balance=_field(data, "ending_balance", int),
        description=_optional(data, "description"),
        type=_field(data, "type", str),
        metadata=_metadata(data),
    )


#: Stripe's account ids; anything else is not an account we can namespace a ledger by.
_ACCOUNT_PREFIX = "acct_"
#: Keys whose requests move real money (secret and restricted live keys).
_LIVE_KEY_PREFIXES = ("sk_live_", "rk_live_")


def parse_account_id(body: object) -> str:
    """The account's id, failing closed: the ledger namespaces every effect by it, so an answer
    without a real ``acct_`` id must never become a namespace."""
    data = _object(body, "account")
    account_id = data.get("id")
    if (
        not isinstance(account_id, str)
        or not account_id.startswith(_ACCOUNT_PREFIX)
        or account_id == _ACCOUNT_PREFIX
    ):
        raise _mismatch("an account without an acct_ id", body)
    return account_id


def is_live_key(api_key: str) -> bool:
    """Stripe's mode is the key's: ``sk_live_``/``rk_live_`` keys move real money, others do not."""
    return api_key.startswith(_LIVE_KEY_PREFIXES)


class _Identified(Protocol):
    @property
    def id(self) -> str: ...


_I = TypeVar("_I", bound=_Identified)


def _every_page(
    fetch: Callable[[str | None], object], parse: Callable[[object], _I], max_pages: int | None = None
) -> list[_I]:
    """Every item of a cursor-paginated list, oldest page last; ``fetch(starting_after)`` gets a page.
    With ``max_pages``, only the items of the first ``max_pages`` pages (the newest).

    A cursor that does not advance (an item seen twice) would loop forever, so it fails closed.
    """
    items: list[_I] = []
    seen: set[str] = set()
    starting_after: str | None = None
    pages = 0
    while max_pages is None or pages < max_pages:
        pages += 1
        page = fetch(starting_after)
        raw, has_more = _list_items(page)
        parsed = [parse(item) for item in raw]
        for item in parsed:
            if item.id in seen:
                raise _mismatch(f"{item.id} twice while paginating", page)
            seen.add(item.id)
        items += parsed
        if not has_more or not parsed:
            return items
        starting_after = parsed[-1].id
    return items


# --- the shared template -------------------------------------------------------------------------


def _at_most_one(matches: list[_I], violation: Callable[[str], str]) -> _I | None:
    """The one match, or None; two or more mean an exactly-once guarantee broke upstream, which is
    reported (``violation`` of their ids) instead of silently picking one."""
    if len(matches) > 1:
        raise ProviderResponseMismatchError(violation(", ".join(match.id for match in matches)))
    return matches[0] if matches else None


def _first_item(body: object, parse: Callable[[object], _I]) -> _I | None:
    """The first item of one list page (newest first), or None for an empty list."""
    items, _has_more = _list_items(body)
    return parse(items[0]) if items else None


@dataclass(frozen=True, kw_only=True)
class _Creation:
    """What every creation sends besides its fields: the caller's metadata with the gateway's own
    keys added (the idempotency key, found again there once the provider forgets it), and the key."""

    metadata: dict[str, str]
    idempotency_key: str


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


class _GatewayBase(ABC):
    """Request building, answer validation and pagination, once for both providers; subclasses
    supply only transport: one primitive per endpoint, answering the provider's JSON object."""

    def __init__(self, *, page_size: int, provider: str, livemode: bool) -> None:
        if not 1 <= page_size <= 100:
            raise UsageError(f"page_size must be 1..100, got {page_size}.")
        self._page_size = page_size
        self._provider = provider
        self._livemode = livemode

    # charges and refunds

    def create_charge(
        self, *, amount: int, currency: str, customer: str, metadata: dict[str, str], idempotency_key: str
    ) -> Charge:
        currency = currency.lower()
        owned = with_owned_metadata(metadata, {IDEMPOTENCY_KEY_METADATA: idempotency_key})
        body = self._post_charge(
            ChargeRequest(
                amount=amount,
                currency=currency,
                customer=customer,
                metadata=owned,
                idempotency_key=idempotency_key,
            )
        )
        charge = parse_charge(body)
        _expect(body, "a charge amount of", charge.amount, amount)
        _expect(body, "a charge currency of", charge.currency, currency)
        _expect(body, "a charge key of", charge.metadata.get(IDEMPOTENCY_KEY_METADATA), idempotency_key)
        return charge

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
        owned = with_owned_metadata(
            metadata, {IDEMPOTENCY_KEY_METADATA: idempotency_key, DURABLE_REASON_METADATA: reason}
        )
        body = self._post_refund(
            RefundRequest(
                charge=charge_id,
                amount=amount,
                reason=stripe_reason(reason),
                metadata=owned,
                idempotency_key=idempotency_key,
            )
        )
        refund = parse_refund(body)
        _expect(body, "a refund of charge", refund.charge_id, charge_id)
        _expect(body, "a refund amount of", refund.amount, amount)
        _expect(body, "a refund currency of", refund.currency, currency.lower())
        _expect(body, "a refund key of", refund.idempotency_key, idempotency_key)
        return refund

    def retrieve_refund(self, refund_id: str) -> Refund:
        body = self._get_refund(refund_id)
        refund = parse_refund(body)
        _expect(body, "refund", refund.id, refund_id)
        return refund

    def list_charge_refunds(self, charge_id: str) -> list[Refund]:
        """Every refund of a charge, all pages read; a refund of another charge fails closed."""

        def of_this_charge(item: object) -> Refund:
            refund = parse_refund(item)
            _expect(item, "a refund of charge", refund.charge_id, charge_id)
            return refund

        return _every_page(
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
        owned = with_owned_metadata(metadata, {IDEMPOTENCY_KEY_METADATA: idempotency_key})
        body = self._post_customer(
            CustomerRequest(email=email, name=name, metadata=owned, idempotency_key=idempotency_key)
        )
        customer = parse_customer(body)
        _expect(body, "a customer email of", customer.email, email)
        _expect(body, "a customer name of", customer.name, name)
        _expect(body, "a customer key of", customer.idempotency_key, idempotency_key)
        return customer

    def retrieve_customer(self, customer_id: str) -> Customer:
        """The customer; a deleted one is returned (``deleted=True``), not raised."""
        return parse_customer(self._get_customer(customer_id))

    def delete_customer(self, customer_id: str) -> Customer:
        """Deletes at the provider; answers the deleted customer. Deleting it again is a 404."""
        body = self._delete_customer(customer_id)
        customer = parse_customer(body)
        _expect(body, "a deleted customer", customer.id, customer_id)
        _expect(body, "a customer deleted flag of", customer.deleted, True)
        return customer

    def list_customers(
        self, *, email: str | None = None, send: PageSender = send_at_once, max_pages: int | None = None
    ) -> list[Customer]:
        return _every_page(
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
        raw, has_more = _list_items(page)
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
        owned = with_owned_metadata(metadata, {IDEMPOTENCY_KEY_METADATA: idempotency_key})
        body = self._post_balance_transaction(
            BalanceTransactionRequest(
                customer_id=customer_id,
                amount=amount,
                currency=currency,
                description=description,
                metadata=owned,
                idempotency_key=idempotency_key,
            )
        )
        transaction = parse_balance_transaction(body)
        _expect(body, "a balance transaction of customer", transaction.customer_id, customer_id)
        _expect(body, "a balance transaction amount of", transaction.amount, amount)
        _expect(body, "a balance transaction currency of", transaction.currency, currency)
        _expect(body, "a balance transaction key of", transaction.idempotency_key, idempotency_key)
        return transaction

    def list_balance_transactions(self, customer_id: str) -> list[BalanceTransaction]:
        return _every_page(
            lambda after: self._list_balance_transactions(
                customer_id, limit=self._page_size, starting_after=after
            ),
            parse_balance_transaction,
        )

    def retrieve_balance_transaction(self, customer_id: str, transaction_id: str) -> BalanceTransaction:
        body = self._get_balance_transaction(customer_id, transaction_id)
        transaction = parse_balance_transaction(body)
        _expect(body, "balance transaction", transaction.id, transaction_id)
        _expect(body, "a balance transaction of customer", transaction.customer_id, customer_id)
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


# --- embedded ------------------------------------------------------------------------------------


class EmbeddedGateway(_GatewayBase):
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
        return _embedded_call(
            lambda: (
                self._store.create_charge(
                    amount=request.amount,
                    currency=request.currency,
                    customer=request.customer,
                    metadata=request.metadata,
                    idempotency_key=request.idempotency_key,
                ).body
            ),
            request.idempotency_key,
        )

    def _post_refund(self, request: RefundRequest) -> object:
        def counted() -> JsonObject:
            self._store.record_refund_request()  # first, exactly where the HTTP front counts it
            return self._store.create_refund(
                charge=request.charge,
                amount=request.amount,
                reason=request.reason,
                metadata=request.metadata,
                idempotency_key=request.idempotency_key,
            ).body

        return _embedded_call(counted, request.idempotency_key)

    def _get_refund(self, refund_id: str) -> object:
        return _embedded_call(lambda: self._store.retrieve_refund(refund_id))

    def _list_refunds(self, charge: str, *, limit: int, starting_after: str | None) -> object:
        return _embedded_call(
            lambda: self._store.list_refunds(limit=limit, starting_after=starting_after, charge=charge)
        )

    def _post_customer(self, request: CustomerRequest) -> object:
        return _embedded_call(
            lambda: (
                self._store.create_customer(
                    email=request.email,
                    name=request.name,
                    metadata=request.metadata,
                    idempotency_key=request.idempotency_key,
                ).body
            ),
            request.idempotency_key,
        )

    def _get_customer(self, customer_id: str) -> object:
        return _embedded_call(lambda: self._store.retrieve_customer(customer_id))

    def _delete_customer(self, customer_id: str) -> object:
        return _embedded_call(lambda: self._store.delete_customer(customer_id))

    def _list_customers(self, *, limit: int, starting_after: str | None, email: str | None) -> object:
        return _embedded_call(
            lambda: self._store.list_customers(limit=limit, starting_after=starting_after, email=email)
        )

    def _post_balance_transaction(self, request: BalanceTransactionRequest) -> object:
        return _embedded_call(
            lambda: (
                self._store.create_balance_transaction(
                    request.customer_id,
                    amount=request.amount,
                    currency=request.currency,
                    description=request.description,
                    metadata=request.metadata,
                    idempotency_key=request.idempotency_key,
                ).body
            ),
            request.idempotency_key,
        )

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


# --- Stripe SDK ----------------------------------------------------------------------------------


class StripeGateway(_GatewayBase):
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
        params: ChargeCreateParams = {
            "amount": request.amount,
            "currency": request.currency,
            "customer": request.customer,
            "metadata": request.metadata,
        }
        return _sdk_call(
            lambda: self._client.v1.charges.create(params=params, options=_keyed(request.idempotency_key)),
            request.idempotency_key,
        )

    def _post_refund(self, request: RefundRequest) -> object:
        params: RefundCreateParams = {
            "charge": request.charge,
            "amount": request.amount,
            "reason": request.reason,
            "metadata": request.metadata,
        }
        return _sdk_call(
            lambda: self._client.v1.refunds.create(params=params, options=_keyed(request.idempotency_key)),
            request.idempotency_key,
        )

    def _get_refund(self, refund_id: str) -> object:
        return _sdk_call(lambda: self._client.v1.refunds.retrieve(refund_id))

    def _list_refunds(self, charge: str, *, limit: int, starting_after: str | None) -> object:
        params: RefundListParams = {"charge": charge, "limit": limit}
        if starting_after is not None:
            params["starting_after"] = starting_after
        return _sdk_call(lambda: self._client.v1.refunds.list(params=params))

    def _post_customer(self, request: CustomerRequest) -> object:
        params: CustomerCreateParams = {"metadata": request.metadata}
        if request.email is not None:
            params["email"] = request.email
        if request.name is not None:
            params["name"] = request.name
        return _sdk_call(
            lambda: self._client.v1.customers.create(params=params, options=_keyed(request.idempotency_key)),
            request.idempotency_key,
        )

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
        params: CustomerBalanceTransactionCreateParams = {
            "amount": request.amount,
            "currency": request.currency,
            "metadata": request.metadata,
        }
        if request.description is not None:
            params["description"] = request.description
        return _sdk_call(
            lambda: self._client.v1.customers.balance_transactions.create(
                request.customer_id, params=params, options=_keyed(request.idempotency_key)
            ),
            request.idempotency_key,
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
        raise _mismatch("an unreadable object", answer) from error


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


# --- factory -------------------------------------------------------------------------------------


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
