"""Stripe's v1 routes, each a thin translation of HTTP parameters into one :class:`PaymentStore`
call: every business rule lives in the store, so the simulator and the embedded provider agree."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from urllib.parse import unquote

from durable_assets.payments.params import JsonObject, StripeApiError
from durable_assets.payments.store import UNCHANGED, PaymentStore, StoreResult, Unchanged
from durable_assets_testing.simulator.expansion import check_expand, check_list_expand, expanded
from durable_assets_testing.simulator.params import (
    Params,
    optional_int,
    page_params,
    parse_params,
    reject_unknown,
    required_int,
    required_str,
)
from durable_assets_testing.simulator.responses import Response, error_response, success_headers

#: ``(store, params, idempotency key, id from the path)``: a plain answer, or a keyed one that
#: may be a replay (then answered with Stripe's ``Idempotent-Replayed`` header).
Handler = Callable[[PaymentStore, Params, str | None, str], StoreResult | JsonObject]
#: The parameters every list route takes, before its own filters.
_PAGING = frozenset({"limit", "starting_after", "ending_before"})


@dataclass(frozen=True)
class Route:
    name: str
    handler: Handler
    path_id: str = ""
    counts_refund_request: bool = False


def match_route(method: str, path: str) -> Route | None:
    if method == "GET" and path == "/v1/account":
        return Route("account", _retrieve_account)
    if method == "POST" and path == "/v1/charges":
        return Route("charges", _create_charge)
    if method == "GET" and path == "/v1/charges":
        return Route("charges.list", _list_charges)
    if method == "POST" and path == "/v1/refunds":
        return Route("refunds", _create_refund, counts_refund_request=True)
    if method == "GET" and path == "/v1/refunds":
        return Route("refunds.list", _list_refunds)
    prefix = "/v1/refunds/"
    if method == "GET" and path.startswith(prefix) and "/" not in path[len(prefix) :]:
        return Route("refunds.retrieve", _retrieve_refund, path_id=unquote(path[len(prefix) :]))
    prefix = "/v1/charges/"
    if method == "GET" and path.startswith(prefix):
        charge_id, slash, rest = path[len(prefix) :].partition("/")
        if charge_id and not slash:
            return Route("charges.retrieve", _retrieve_charge, path_id=unquote(charge_id))
        if charge_id and rest == "refunds":  # the URL of a charge's embedded refund list
            return Route("charges.refunds", _list_charge_refunds, path_id=unquote(charge_id))
    return _match_customer_route(method, path)


def _match_customer_route(method: str, path: str) -> Route | None:
    if path == "/v1/customers":
        if method == "POST":
            return Route("customers", _create_customer)
        if method == "GET":
            return Route("customers.list", _list_customers)
        return None
    prefix = "/v1/customers/"
    if not path.startswith(prefix):
        return None
    customer_id, slash, rest = path[len(prefix) :].partition("/")
    customer_id = unquote(customer_id)
    if not customer_id:
        return None
    if method == "GET" and not slash:
        return Route("customers.retrieve", _retrieve_customer, path_id=customer_id)
    if method == "DELETE" and not slash:
        return Route("customers.delete", _delete_customer, path_id=customer_id)
    if method == "POST" and not slash:
        return Route("customers.update", _update_customer, path_id=customer_id)
    transactions = "balance_transactions/"
    if method == "GET" and rest.startswith(transactions) and "/" not in rest[len(transactions) :]:
        transaction_id = unquote(rest[len(transactions) :])
        if transaction_id:
            return Route(
                "customers.balance_transactions.retrieve",
                _retrieve_balance_transaction,
                path_id=f"{customer_id}/{transaction_id}",
            )
    if rest == "balance_transactions" and method == "POST":
        return Route("customers.balance_transactions", _create_balance_transaction, path_id=customer_id)
    if rest == "balance_transactions" and method == "GET":
        return Route("customers.balance_transactions.list", _list_balance_transactions, path_id=customer_id)
    return None


def run_route(store: PaymentStore, route: Route, encoded_params: str, key: str | None) -> Response:
    try:
        params = parse_params(encoded_params)
        result = route.handler(store, params, key, route.path_id)
    except StripeApiError as error:
        return error_response(error, key)
    if isinstance(result, StoreResult):
        return Response(200, result.body, success_headers(key, result.replayed))
    return Response(200, result)


# --- creations: checked before anything is committed, expanded after, as at Stripe ---------------


def _created(
    kind: str, allowed: set[str], create: Callable[[PaymentStore, Params, str | None, str], StoreResult]
) -> Handler:
    def handler(store: PaymentStore, params: Params, key: str | None, path_id: str) -> StoreResult:
        reject_unknown(params, allowed)
        check_expand(kind, params.expand)
        result = create(store, params, key, path_id)
        return replace(result, body=expanded(store, result.body, params.expand))

    return handler


_create_charge = _created(
    "charge",
    {"amount", "currency", "customer", "description", "source"},
    lambda store, params, key, _: store.create_charge(
        amount=required_int(params, "amount"),
        currency=required_str(params, "currency"),
        customer=params.values.get("customer"),
        description=params.values.get("description"),
        metadata=params.metadata,
        idempotency_key=key,
    ),
)
_create_refund = _created(
    "refund",
    {"charge", "amount", "reason"},
    lambda store, params, key, _: store.create_refund(
        charge=required_str(params, "charge"),
        amount=optional_int(params, "amount"),
        reason=params.values.get("reason") or None,
        metadata=params.metadata,
        idempotency_key=key,
    ),
)
_create_customer = _created(
    "customer",
    {"email", "name"},
    lambda store, params, key, _: store.create_customer(
        email=params.values.get("email") or None,
        name=params.values.get("name") or None,
        metadata=params.metadata,
        idempotency_key=key,
    ),
)


def _changed(params: Params, name: str) -> str | Unchanged | None:
    """Stripe's update encoding: an absent field is left as it is, an empty one is unset."""
    if name not in params.values:
        return UNCHANGED
    return params.values[name] or None


_update_customer = _created(
    "customer",
    {"email", "name", "description"},
    lambda store, params, key, customer: store.update_customer(
        customer,
        email=_changed(params, "email"),
        name=_changed(params, "name"),
        description=_changed(params, "description"),
        metadata=params.metadata,
        idempotency_key=key,
    ),
)
_create_balance_transaction = _created(
    "customer_balance_transaction",
    {"amount", "currency", "description"},
    lambda store, params, key, customer: store.create_balance_transaction(
        customer,
        amount=required_int(params, "amount"),
        currency=required_str(params, "currency"),
        description=params.values.get("description") or None,
        metadata=params.metadata,
        idempotency_key=key,
    ),
)


# --- one object by its id from the path ----------------------------------------------------------


def _retrieved(kind: str, fetch: Callable[[PaymentStore, str], JsonObject]) -> Handler:
    def handler(store: PaymentStore, params: Params, _key: str | None, path_id: str) -> JsonObject:
        reject_unknown(params, set(), allow_metadata=False)
        check_expand(kind, params.expand)
        return expanded(store, fetch(store, path_id), params.expand)

    return handler


def _balance_transaction(store: PaymentStore, path_id: str) -> JsonObject:
    """``path_id`` is ``customer/transaction``: both ids come from the path (neither holds a ``/``)."""
    customer, _, transaction = path_id.partition("/")
    return store.retrieve_balance_transaction(customer, transaction)


# Expanding an account or a deleted customer changes nothing: every path is refused before work.
_retrieve_account = _retrieved("account", lambda store, _: store.account())
_retrieve_refund = _retrieved("refund", PaymentStore.retrieve_refund)
_retrieve_charge = _retrieved("charge", PaymentStore.retrieve_charge)
_retrieve_customer = _retrieved("customer", PaymentStore.retrieve_customer)
_delete_customer = _retrieved("deleted_customer", PaymentStore.delete_customer)
_retrieve_balance_transaction = _retrieved("customer_balance_transaction", _balance_transaction)


# --- lists: a page, newest first ------------------------------------------------------------------


def _listed(
    items: str, filters: set[str], page: Callable[[PaymentStore, Params, str], JsonObject]
) -> Handler:
    def handler(store: PaymentStore, params: Params, _key: str | None, path_id: str) -> JsonObject:
        reject_unknown(params, _PAGING | filters, allow_metadata=False)
        check_list_expand(items, params.expand)
        return expanded(store, page(store, params, path_id), params.expand)

    return handler


def _listed_by(items: str, filter_name: str, list_page: Callable[..., JsonObject]) -> Handler:
    """A top-level list with one optional filter, named as ``list_page``'s keyword (the store's
    unbound ``list_*``): the three such lists differ only in these three names."""
    return _listed(
        items,
        {filter_name},
        lambda store, params, _: list_page(
            store, **page_params(params), **{filter_name: params.values.get(filter_name) or None}
        ),
    )


_list_refunds = _listed_by("refund", "charge", PaymentStore.list_refunds)
_list_charges = _listed_by("charge", "customer", PaymentStore.list_charges)
_list_customers = _listed_by("customer", "email", PaymentStore.list_customers)
_list_balance_transactions = _listed(
    "customer_balance_transaction",
    set(),
    lambda store, params, customer: store.list_balance_transactions(customer, **page_params(params)),
)
_list_charge_refunds = _listed(
    "refund",
    set(),
    lambda store, params, charge: {
        **store.list_refunds(**page_params(params), charge=charge),
        "url": f"/v1/charges/{charge}/refunds",
    },
)
