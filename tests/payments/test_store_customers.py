"""PaymentStore: customers and customer balance transactions with Stripe's semantics."""

from __future__ import annotations

import itertools
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from durable_assets.payments.store import PaymentStore, StripeApiError
from tests.support.counters import counters


@pytest.fixture
def store(tmp_path: Path) -> Iterator[PaymentStore]:
    with PaymentStore(str(tmp_path / "payments.db")) as opened:
        yield opened


def _error(call: Any) -> StripeApiError:
    with pytest.raises(StripeApiError) as caught:
        call()
    return caught.value


def _customer(store: PaymentStore, email: str = "ada@example.com", **metadata: str) -> str:
    return str(store.create_customer(email=email, name="Ada", metadata=metadata).body["id"])


def test_customer_is_stripe_shaped(store: PaymentStore) -> None:
    customer = store.create_customer(
        email="ada@example.com", name="Ada", metadata={"legacy_account_id": "L1"}
    )

    body = customer.body
    assert body["id"].startswith("cus_")
    assert (body["object"], body["email"], body["name"]) == ("customer", "ada@example.com", "Ada")
    assert (body["balance"], body["currency"]) == (0, None)  # no currency before a balance transaction
    assert body["metadata"] == {"legacy_account_id": "L1"}
    assert customer.replayed is False
    assert store.retrieve_customer(body["id"]) == body


def test_unknown_customer_is_resource_missing(store: PaymentStore) -> None:
    missing = _error(lambda: store.retrieve_customer("cus_missing"))
    no_owner = _error(lambda: store.create_balance_transaction("cus_missing", amount=-1, currency="usd"))

    assert (missing.http_status, missing.code, missing.param) == (404, "resource_missing", "id")
    assert (no_owner.http_status, no_owner.code, no_owner.param) == (404, "resource_missing", "customer")
    assert no_owner.message == "No such customer: 'cus_missing'"


def test_balance_moves_by_each_amount_and_records_the_ending_balance(store: PaymentStore) -> None:
    customer = _customer(store)
    first = store.create_balance_transaction(customer, amount=-5000, currency="USD", description="migrated")
    second = store.create_balance_transaction(customer, amount=1250, currency="usd", metadata={"k": "v"})

    assert first.body["id"].startswith("cbtxn_")
    assert (first.body["object"], first.body["type"]) == ("customer_balance_transaction", "adjustment")
    assert (first.body["amount"], first.body["ending_balance"], first.body["currency"]) == (
        -5000,
        -5000,
        "usd",
    )
    assert (first.body["customer"], first.body["description"]) == (customer, "migrated")
    assert (second.body["ending_balance"], second.body["metadata"]) == (-3750, {"k": "v"})
    assert store.retrieve_customer(customer)["balance"] == -3750
    assert store.retrieve_customer(customer)["currency"] == "usd"


def test_the_first_balance_transaction_fixes_the_currency(store: PaymentStore) -> None:
    customer = _customer(store)
    store.create_balance_transaction(customer, amount=-100, currency="eur")

    other = _error(lambda: store.create_balance_transaction(customer, amount=-100, currency="usd"))

    assert (other.http_status, other.error_type, other.param) == (400, "invalid_request_error", "currency")
    assert "eur" in other.message
    assert store.retrieve_customer(customer)["balance"] == -100  # nothing moved
    assert store.stats()["balance_transactions_created"] == 1


def test_balance_transaction_validation(store: PaymentStore) -> None:
    customer = _customer(store)

    for amount, code in ((0, "parameter_invalid_integer"), (10**8, "amount_too_large"), (True, None)):
        error = _error(
            lambda amount=amount: store.create_balance_transaction(customer, amount=amount, currency="usd")
        )
        assert (error.http_status, error.param) == (400, "amount"), amount
        assert code is None or error.code == code
    assert _error(lambda: store.create_balance_transaction(customer, amount=1, currency="dollars")).param == (
        "currency"
    )
    long_description = "x" * 351
    assert _error(
        lambda: store.create_balance_transaction(
            customer, amount=1, currency="usd", description=long_description
        )
    ).param == ("description")
    assert store.retrieve_customer(customer)["balance"] == 0


def test_customer_validation(store: PaymentStore) -> None:
    for email in ("no-at-sign", "a@", "@b", "a b@c.d", "x" * 510 + "@b.c"):
        assert _error(lambda email=email: store.create_customer(email=email)).param == "email", email
    assert _error(lambda: store.create_customer(name="n" * 257)).param == "name"
    assert _error(lambda: store.create_customer(metadata={"k" * 41: "v"})).param == f"metadata[{'k' * 41}]"
    assert store.create_customer().body["email"] is None  # every parameter is optional
    assert store.stats()["customers_created"] == 1


def test_same_key_same_params_replays_and_counts(store: PaymentStore) -> None:
    first = store.create_customer(email="a@b.c", metadata={"x": "1", "y": "2"}, idempotency_key="cust-1")
    again = store.create_customer(email="a@b.c", metadata={"y": "2", "x": "1"}, idempotency_key="cust-1")
    customer = str(first.body["id"])
    moved = store.create_balance_transaction(customer, amount=-700, currency="usd", idempotency_key="bt-1")
    moved_again = store.create_balance_transaction(
        customer, amount=-700, currency="usd", idempotency_key="bt-1"
    )

    assert (again.body, again.replayed) == (first.body, True)
    assert (moved_again.body, moved_again.replayed) == (moved.body, True)
    assert store.retrieve_customer(customer)["balance"] == -700  # moved once
    assert store.stats() == counters(
        idempotent_replays=2, customers_created=1, balance_transactions_created=1
    )


def test_same_key_other_params_is_an_idempotency_error(store: PaymentStore) -> None:
    customer = _customer(store)
    other = _customer(store, "bob@example.com")
    store.create_customer(email="a@b.c", idempotency_key="cust-1")
    store.create_balance_transaction(customer, amount=-700, currency="usd", idempotency_key="bt-1")

    errors = [
        _error(lambda: store.create_customer(email="other@b.c", idempotency_key="cust-1")),
        _error(
            lambda: store.create_balance_transaction(
                customer, amount=-701, currency="usd", idempotency_key="bt-1"
            )
        ),
        _error(
            lambda: store.create_balance_transaction(
                other, amount=-700, currency="usd", idempotency_key="bt-1"
            )
        ),
    ]

    assert {(error.http_status, error.error_type) for error in errors} == {(400, "idempotency_error")}
    assert store.retrieve_customer(customer)["balance"] == -700
    assert store.retrieve_customer(other)["balance"] == 0


def test_a_rejected_balance_transaction_is_replayed_as_rejected(store: PaymentStore) -> None:
    """Like Stripe: the request began executing, so its 400 is the key's answer from then on."""
    customer = _customer(store)
    store.create_balance_transaction(customer, amount=-1, currency="eur")

    first = _error(
        lambda: store.create_balance_transaction(customer, amount=-1, currency="usd", idempotency_key="k")
    )
    again = _error(
        lambda: store.create_balance_transaction(customer, amount=-1, currency="usd", idempotency_key="k")
    )

    assert (first.replayed, again.replayed) == (False, True)
    assert again.message == first.message
    assert store.stats()["idempotent_replays"] == 1


def test_a_customer_key_reused_for_a_balance_transaction_is_refused(store: PaymentStore) -> None:
    """Stripe binds a key to its first endpoint (issue #34); before, this moved the balance."""
    customer = str(store.create_customer(email="a@b.c", idempotency_key="same").body["id"])

    with pytest.raises(StripeApiError, match="same endpoint they were first used for") as caught:
        store.create_balance_transaction(customer, amount=5, currency="usd", idempotency_key="same")

    assert (caught.value.http_status, caught.value.error_type) == (400, "idempotency_error")
    assert store.retrieve_customer(customer)["balance"] == 0


def test_threads_moving_one_balance_lose_no_update(store: PaymentStore) -> None:
    customer = _customer(store)
    barrier = threading.Barrier(8)

    def move(worker: int) -> None:
        barrier.wait()
        for step in range(5):
            key = f"bt-{worker}-{step}"
            for _ in range(2):  # each request sent twice: the second is a replay
                store.create_balance_transaction(
                    customer, amount=-(worker + 1), currency="usd", idempotency_key=key
                )

    threads = [threading.Thread(target=move, args=(worker,)) for worker in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)

    transactions = store.list_balance_transactions(customer, limit=100)["data"]
    assert store.retrieve_customer(customer)["balance"] == -5 * sum(range(1, 9))
    assert len(transactions) == 40
    # newest first: each ending balance is the previous one plus its amount
    oldest_first = list(reversed(transactions))
    for before, after in itertools.pairwise(oldest_first):
        assert after["ending_balance"] == before["ending_balance"] + after["amount"]
    assert store.stats()["idempotent_replays"] == 40


def test_customer_list_newest_first_paginated_and_filtered_by_email(store: PaymentStore) -> None:
    ids = [_customer(store, f"user{i % 2}@example.com") for i in range(5)]  # 0,2,4 share an email

    everyone = store.list_customers()
    page = store.list_customers(limit=2, starting_after=ids[3])
    newer = store.list_customers(limit=1, ending_before=ids[2])
    same_email = store.list_customers(email="user0@example.com")
    case_differs = store.list_customers(email="USER0@example.com")

    assert [c["id"] for c in everyone["data"]] == ids[::-1]
    assert (everyone["url"], everyone["has_more"]) == ("/v1/customers", False)
    assert ([c["id"] for c in page["data"]], page["has_more"]) == ([ids[2], ids[1]], True)
    assert ([c["id"] for c in newer["data"]], newer["has_more"]) == ([ids[3]], True)
    assert [c["id"] for c in same_email["data"]] == [ids[4], ids[2], ids[0]]
    assert case_differs["data"] == []  # Stripe's email filter is case-sensitive
    assert _error(lambda: store.list_customers(starting_after="cus_missing")).code == "resource_missing"
    assert _error(lambda: store.list_customers(limit=101)).param == "limit"


def test_balance_transaction_list_is_per_customer_and_paginated(store: PaymentStore) -> None:
    customer, other = _customer(store), _customer(store, "bob@example.com")
    ids = [
        str(store.create_balance_transaction(customer, amount=-i, currency="usd").body["id"])
        for i in range(1, 5)
    ]
    store.create_balance_transaction(other, amount=9, currency="gbp")

    first = store.list_balance_transactions(customer, limit=3)
    rest = store.list_balance_transactions(customer, limit=3, starting_after=first["data"][-1]["id"])
    back = store.list_balance_transactions(customer, limit=2, ending_before=ids[0])

    assert first["url"] == f"/v1/customers/{customer}/balance_transactions"
    assert ([t["id"] for t in first["data"]], first["has_more"]) == (ids[:0:-1], True)
    assert ([t["id"] for t in rest["data"]], rest["has_more"]) == ([ids[0]], False)
    assert ([t["id"] for t in back["data"]], back["has_more"]) == ([ids[2], ids[1]], True)
    missing = _error(lambda: store.list_balance_transactions("cus_missing"))
    assert (missing.http_status, missing.param) == (404, "customer")
