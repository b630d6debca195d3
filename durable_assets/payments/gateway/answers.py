"""Every answer checked against what was asked. Anything that does not match raises
:class:`~durable_assets.errors.ProviderResponseMismatchError`: for money, failing closed is the
only safe reaction to an answer we do not understand.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, Protocol, TypeVar

from durable_assets.errors import ProviderResponseMismatchError
from durable_assets.payments.gateway.models import BalanceTransaction, Charge, Customer, Refund

_T = TypeVar("_T")


def mismatch(what: str, body: object) -> ProviderResponseMismatchError:
    return ProviderResponseMismatchError(
        f"Payment provider answered with {what}; failing closed. Answer: {str(body)[:500]}"
    )


def _field(body: Mapping[str, Any], name: str, kind: type[_T]) -> _T:
    value = body.get(name)
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        raise mismatch(f"a malformed {name!r}", body)
    return value


def _metadata(body: Mapping[str, Any]) -> dict[str, str]:
    raw = body.get("metadata")
    raw = {} if raw is None else raw
    if not isinstance(raw, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in raw.items()
    ):
        raise mismatch("malformed metadata", body)
    return dict(raw)


def _object(body: object, kind: str) -> Mapping[str, Any]:
    if not isinstance(body, dict) or body.get("object") != kind:
        raise mismatch(f"something that is not a {kind}", body)
    return body


def parse_refund(body: object) -> Refund:
    data = _object(body, "refund")
    charge = data.get("charge")
    charge_id = charge.get("id") if isinstance(charge, dict) else charge  # expanded or not
    reason = data.get("reason")
    if not isinstance(charge_id, str) or not (reason is None or isinstance(reason, str)):
        raise mismatch("a refund without a valid charge or reason", body)
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


def expect(body: object, what: str, actual: object, expected: object) -> None:
    if actual != expected:
        raise mismatch(f"{what} {actual!r} where {expected!r} was asked", body)


def list_items(body: object) -> tuple[list[object], bool]:
    data = _object(body, "list")
    items = data.get("data")
    has_more = data.get("has_more")
    if not isinstance(items, list) or not isinstance(has_more, bool):
        raise mismatch("a malformed list", body)
    return items, has_more


def _optional(body: Mapping[str, Any], name: str) -> str | None:
    value = body.get(name)
    if value is not None and not isinstance(value, str):
        raise mismatch(f"a malformed {name!r}", body)
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
        raise mismatch("a balance transaction without a valid customer", body)
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
        raise mismatch("an account without an acct_ id", body)
    return account_id


def is_live_key(api_key: str) -> bool:
    """Stripe's mode is the key's: ``sk_live_``/``rk_live_`` keys move real money, others do not."""
    return api_key.startswith(_LIVE_KEY_PREFIXES)


class _Identified(Protocol):
    @property
    def id(self) -> str: ...


IdentifiedT = TypeVar("IdentifiedT", bound=_Identified)


def every_page(
    fetch: Callable[[str | None], object],
    parse: Callable[[object], IdentifiedT],
    max_pages: int | None = None,
) -> list[IdentifiedT]:
    """Every item of a cursor-paginated list, oldest page last; ``fetch(starting_after)`` gets a page.
    With ``max_pages``, only the items of the first ``max_pages`` pages (the newest).

    A cursor that does not advance (an item seen twice) would loop forever, so it fails closed.
    """
    items: list[IdentifiedT] = []
    seen: set[str] = set()
    starting_after: str | None = None
    pages = 0
    while max_pages is None or pages < max_pages:
        pages += 1
        page = fetch(starting_after)
        raw, has_more = list_items(page)
        parsed = [parse(item) for item in raw]
        for item in parsed:
            if item.id in seen:
                raise mismatch(f"{item.id} twice while paginating", page)
            seen.add(item.id)
        items += parsed
        if not has_more or not parsed:
            return items
        starting_after = parsed[-1].id
    return items
