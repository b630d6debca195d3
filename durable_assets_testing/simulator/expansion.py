"""Stripe's ``expand[]``: a field holding an ID is replaced by the object it names, on request.

Paths are checked before any work (an expansion the simulator cannot honour must not follow a
committed write), then applied to the answer, so an idempotent replay is expanded afresh.
"""

from __future__ import annotations

from collections.abc import Callable

from durable_assets.payments.params import JsonObject, StripeApiError, invalid_request
from durable_assets.payments.store import PaymentStore

# For each object, the fields Stripe lets a client expand, and what the simulator serves there:
# an object kind it retrieves ("charge", "customer"), None (always null or already embedded here,
# so expanding it changes nothing, as at Stripe), or a reason it cannot (the simulator has no such
# objects; a silent ID would break the client).

_RETRIEVE: dict[str, Callable[[PaymentStore, str], JsonObject]] = {
    "charge": PaymentStore.retrieve_charge,
    "customer": PaymentStore.retrieve_customer,
}

_CANNOT_EXPAND = "the simulator serves no {field} objects"
_EXPANDABLE: dict[str, dict[str, str | None]] = {
    "refund": {
        "charge": "charge",
        "balance_transaction": None,
        "failure_balance_transaction": None,
        "payment_intent": None,
        "source_transfer_reversal": None,
        "transfer_reversal": None,
    },
    "charge": {
        "refunds": None,  # the list is always embedded
        "customer": _CANNOT_EXPAND,
        "application": None,
        "application_fee": None,
        "balance_transaction": None,
        "failure_balance_transaction": None,
        "on_behalf_of": None,
        "payment_intent": None,
        "review": None,
        "source_transfer": None,
        "transfer": None,
    },
    "customer": {
        "address": None,
        "default_source": None,
        "discount": None,
        "invoice_settings": None,
        "shipping": None,
        "test_clock": None,
        # included only when expanded, and the simulator has none of them to include
        "sources": _CANNOT_EXPAND,
        "subscriptions": _CANNOT_EXPAND,
        "tax": _CANNOT_EXPAND,
        "tax_ids": _CANNOT_EXPAND,
    },
    "customer_balance_transaction": {
        "customer": "customer",
        "credit_note": None,
        "invoice": None,
    },
    # nothing in either is an expandable ID the simulator serves
    "account": {},
    "deleted_customer": {},
}


def check_expand(kind: str, paths: tuple[str, ...]) -> None:
    """Rejects, before any work, a path Stripe would reject or the simulator cannot honour."""
    for path in paths:
        _check_expand_path(kind, path.split("."), path)


def check_list_expand(items: str, paths: tuple[str, ...]) -> None:
    """A list's paths start with ``data.``, then continue in its items (of kind ``items``)."""
    for path in paths:
        fields = path.split(".")
        if fields[0] != "data" or len(fields) < 2:
            raise _cannot_expand(path, fields[0])
        _check_expand_path(items, fields[1:], path)


def _check_expand_path(kind: str, fields: list[str], path: str) -> None:
    field, rest = fields[0], fields[1:]
    expandable = _EXPANDABLE[kind]
    if field not in expandable:
        raise _cannot_expand(path, field)
    target = expandable[field]
    if target in _RETRIEVE and rest:
        _check_expand_path(target, rest, path)
    elif target is not None and target not in _RETRIEVE:
        raise invalid_request(
            f"The payment simulator cannot expand {path}: {target.format(field=field)}.", param="expand"
        )


def _cannot_expand(path: str, field: str) -> StripeApiError:
    where = "" if path == field else f" in {path}"
    return invalid_request(f"This property cannot be expanded ({field}){where}.", param="expand")


def expanded(store: PaymentStore, body: JsonObject, paths: tuple[str, ...]) -> JsonObject:
    """A copy of ``body`` with the (already checked) paths expanded."""
    for path in paths:
        body = _expand_path(store, body, path.split("."))
    return body


def _expand_path(store: PaymentStore, body: JsonObject, fields: list[str]) -> JsonObject:
    if body.get("object") == "list":
        return {**body, "data": [_expand_path(store, item, fields[1:]) for item in body["data"]]}
    field, rest = fields[0], fields[1:]
    value = body.get(field)
    target = _EXPANDABLE[str(body["object"])].get(field)
    if isinstance(value, str) and target in _RETRIEVE:
        value = _RETRIEVE[target](store, value)
    if rest and isinstance(value, dict):
        value = _expand_path(store, value, rest)
    return body if value is body.get(field) else {**body, field: value}
