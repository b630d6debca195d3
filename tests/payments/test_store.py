"""PaymentStore: Stripe's refund and idempotency semantics, across threads and processes."""

from __future__ import annotations

import multiprocessing
import re
import threading
from collections.abc import Iterator
from multiprocessing.queues import Queue
from multiprocessing.synchronize import Event
from pathlib import Path
from typing import Any

import pytest

from durable_assets.payments.gateway import EmbeddedGateway
from durable_assets.payments.store import PaymentStore, StripeApiError, _new_id
from tests.support.counters import counters


@pytest.fixture
def db_path(tmp_path: Path) -> str:
    return str(tmp_path / "payments.db")


@pytest.fixture
def store(db_path: str) -> Iterator[PaymentStore]:
    with PaymentStore(db_path) as opened:
        yield opened


def _charge(store: PaymentStore, amount: int = 1000) -> str:
    return str(store.create_charge(amount=amount, currency="USD", customer="cus_1").body["id"])


def _error(call: Any) -> StripeApiError:
    with pytest.raises(StripeApiError) as caught:
        call()
    return caught.value


def test_charge_is_stripe_shaped(store: PaymentStore) -> None:
    charge = store.create_charge(amount=1234, currency="EUR", metadata={"invoice": "inv_1"}).body

    assert charge["id"].startswith("ch_")
    assert charge["object"] == "charge"
    assert (charge["amount"], charge["amount_refunded"], charge["currency"]) == (1234, 0, "eur")
    assert charge["refunded"] is False
    assert charge["metadata"] == {"invoice": "inv_1"}
    assert isinstance(charge["created"], int)


def test_ids_are_stripe_shaped_and_use_every_character() -> None:
    """24 characters of 62 after the prefix, from one random draw each: no id repeats, and every
    character of the alphabet turns up in every position over a few thousand ids."""
    ids = [_new_id("ch") for _ in range(3_000)]
    assert len(set(ids)) == len(ids)
    assert all(re.fullmatch(r"ch_[A-Za-z0-9]{24}", i) for i in ids)
    assert all(len({i[3 + position] for i in ids}) == 62 for position in range(24))


def test_refund_never_exceeds_the_unrefunded_amount(store: PaymentStore) -> None:
    charge = _charge(store, 1000)
    store.create_refund(charge=charge, amount=600)

    too_large = _error(lambda: store.create_refund(charge=charge, amount=401))
    rest = store.create_refund(charge=charge).body  # no amount: everything still refundable
    exhausted = _error(lambda: store.create_refund(charge=charge, amount=1))

    assert (too_large.http_status, too_large.error_type, too_large.code) == (
        400,
        "invalid_request_error",
        "amount_too_large",
    )
    assert too_large.to_body()["error"]["param"] == "amount"
    assert rest["amount"] == 400
    assert (exhausted.http_status, exhausted.code) == (400, "charge_already_refunded")
    assert store.stats()["refunds_created"] == 2


def test_partial_refunds_sum_exactly_to_the_charge(store: PaymentStore) -> None:
    charge = _charge(store, 1000)
    for amount in (333, 333, 333, 1):
        store.create_refund(charge=charge, amount=amount)

    refunds = store.list_refunds(charge=charge, limit=100)["data"]

    assert sum(refund["amount"] for refund in refunds) == 1000
    assert _error(lambda: store.create_refund(charge=charge, amount=1)).code == "charge_already_refunded"


def test_unknown_charge_is_resource_missing(store: PaymentStore) -> None:
    error = _error(lambda: store.create_refund(charge="ch_nope", amount=1))

    assert (error.http_status, error.code) == (404, "resource_missing")
    assert error.to_body() == {
        "error": {
            "type": "invalid_request_error",
            "code": "resource_missing",
            "message": "No such charge: 'ch_nope'",
            "param": "charge",
        }
    }


def test_same_key_and_params_replays_the_stored_body(store: PaymentStore) -> None:
    charge = _charge(store)
    first = store.create_refund(
        charge=charge, amount=100, reason="duplicate", metadata={"a": "1", "b": "2"}, idempotency_key="k1"
    )
    second = store.create_refund(
        charge=charge, amount=100, reason="duplicate", metadata={"b": "2", "a": "1"}, idempotency_key="k1"
    )

    assert second.body == first.body
    assert (first.replayed, second.replayed) == (False, True)
    assert store.stats() == counters(refunds_created=1, idempotent_replays=1)


def test_same_key_different_params_is_refused(store: PaymentStore) -> None:
    charge = _charge(store)
    store.create_refund(charge=charge, amount=100, idempotency_key="k1")

    error = _error(lambda: store.create_refund(charge=charge, amount=200, idempotency_key="k1"))

    assert (error.http_status, error.error_type) == (400, "idempotency_error")
    assert len(store.list_refunds(charge=charge)["data"]) == 1
    assert store.stats()["idempotent_replays"] == 0


def test_client_errors_are_stored_and_replayed(store: PaymentStore) -> None:
    charge = _charge(store, 1000)
    first = _error(lambda: store.create_refund(charge=charge, amount=5000, idempotency_key="k1"))
    replay = _error(lambda: store.create_refund(charge=charge, amount=5000, idempotency_key="k1"))
    # The key is bound to the failed request: a corrected amount needs a new key, as at Stripe.
    rebound = _error(lambda: store.create_refund(charge=charge, amount=500, idempotency_key="k1"))

    assert first.to_body() == replay.to_body()
    assert (first.replayed, replay.replayed) == (False, True)
    assert rebound.error_type == "idempotency_error"
    assert store.stats() == counters(idempotent_replays=1)


def test_validation_errors_are_not_stored(store: PaymentStore) -> None:
    charge = _charge(store)
    invalid = _error(
        lambda: store.create_refund(charge=charge, amount=1, reason="bogus", idempotency_key="k1")
    )

    refund = store.create_refund(charge=charge, amount=1, reason="fraudulent", idempotency_key="k1").body

    assert (invalid.http_status, invalid.to_body()["error"]["param"]) == (400, "reason")
    assert refund["reason"] == "fraudulent"


def test_metadata_follows_stripe_limits(store: PaymentStore) -> None:
    charge = _charge(store)

    long_key = _error(lambda: store.create_refund(charge=charge, metadata={"k" * 41: "v"}))
    long_value = _error(lambda: store.create_refund(charge=charge, metadata={"k": "v" * 501}))

    assert long_key.http_status == long_value.http_status == 400
    assert store.stats()["refunds_created"] == 0


def test_a_key_is_bound_to_the_endpoint_it_was_first_used_on(store: PaymentStore) -> None:
    """Stripe's rule (issue #34): a key reused on another endpoint is a 400, never a second effect."""
    charge = store.create_charge(amount=1000, currency="usd", idempotency_key="shared").body
    customer = store.create_customer(email="a@example.com").body["id"]
    store.create_balance_transaction(customer, amount=-5, currency="usd", idempotency_key="bt")
    other = store.create_customer(email="b@example.com").body["id"]

    on_refunds = _error(lambda: store.create_refund(charge=charge["id"], amount=10, idempotency_key="shared"))
    on_other_customer = _error(
        lambda: store.create_balance_transaction(other, amount=-5, currency="usd", idempotency_key="bt")
    )
    replay = store.create_charge(amount=1000, currency="usd", idempotency_key="shared")

    assert (on_refunds.http_status, on_refunds.error_type, on_refunds.param) == (
        400,
        "idempotency_error",
        None,
    )
    assert on_refunds.message.startswith(
        "Keys for idempotent requests can only be used for the same endpoint they were first used for "
        "('/v1/charges' vs '/v1/refunds')"
    )
    assert f"'/v1/customers/{customer}/balance_transactions' vs" in on_other_customer.message
    assert (replay.replayed, replay.body["id"]) == (True, charge["id"])
    assert store.stats()["refunds_created"] == 0
    assert store.retrieve_customer(other)["balance"] == 0


def test_threads_racing_one_key_create_one_refund(store: PaymentStore) -> None:
    charge = _charge(store, 10_000)
    barrier = threading.Barrier(16)
    ids: list[str] = []

    def race() -> None:
        barrier.wait(timeout=10)
        ids.append(store.create_refund(charge=charge, amount=100, idempotency_key="race").body["id"])

    threads = [threading.Thread(target=race) for _ in range(16)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=10)

    assert len(ids) == 16 and len(set(ids)) == 1
    assert store.stats() == counters(refunds_created=1, idempotent_replays=15)


def _race_worker(db_path: str, ready: Queue[None], go: Event, out: Queue[list[str]]) -> None:
    """Runs in a spawned process: opens the (new) file and races the other process on every step."""
    ready.put(None)
    go.wait(timeout=30)
    try:
        with PaymentStore(db_path) as store:
            charge = str(
                store.create_charge(amount=10_000, currency="usd", idempotency_key="charge").body["id"]
            )
            ids = [
                str(store.create_refund(charge=charge, amount=100, idempotency_key="race").body["id"])
                for _ in range(10)
            ]
    except Exception as error:  # report instead of leaving the parent waiting on the queue
        ids = [f"worker failed: {error!r}"]
    out.put(ids)


def test_processes_racing_one_key_create_one_refund(db_path: str) -> None:
    """Also covers two processes creating the same new file at once (WAL switch and schema)."""
    context = multiprocessing.get_context("spawn")
    ready: Queue[None] = context.Queue()
    out: Queue[list[str]] = context.Queue()
    go = context.Event()
    workers = [context.Process(target=_race_worker, args=(db_path, ready, go, out)) for _ in range(2)]
    for worker in workers:
        worker.start()
    for _ in workers:
        ready.get(timeout=60)

    go.set()
    ids = [refund_id for _ in workers for refund_id in out.get(timeout=60)]
    for worker in workers:
        worker.join(timeout=30)

    assert [worker.exitcode for worker in workers] == [0, 0]
    assert len(ids) == 20 and len(set(ids)) == 1
    with PaymentStore(db_path) as store:
        assert store.stats() == counters(refunds_created=1, idempotent_replays=19)


def test_list_is_newest_first_paginated_and_filtered(store: PaymentStore) -> None:
    charge, other = _charge(store), _charge(store)
    created = [store.create_refund(charge=charge, amount=1).body["id"] for _ in range(5)]
    store.create_refund(charge=other, amount=1)

    pages, cursor = [], None
    while True:
        page = store.list_refunds(limit=2, charge=charge, starting_after=cursor)
        pages.append(page)
        if not page["has_more"]:
            break
        cursor = page["data"][-1]["id"]

    assert [len(page["data"]) for page in pages] == [2, 2, 1]
    assert [refund["id"] for page in pages for refund in page["data"]] == created[::-1]
    assert pages[0]["object"] == "list" and pages[0]["url"] == "/v1/refunds"
    assert len(store.list_refunds(limit=100)["data"]) == 6
    assert _error(lambda: store.list_refunds(charge="ch_nope")).http_status == 404
    assert _error(lambda: store.list_refunds(limit=101)).code == "parameter_invalid_integer"
    assert _error(lambda: store.list_refunds(limit=0)).code == "parameter_invalid_integer"


def test_retrieve_refund(store: PaymentStore) -> None:
    refund = store.create_refund(charge=_charge(store), amount=5, metadata={"idempotency_key": "k"}).body

    assert store.retrieve_refund(refund["id"]) == refund
    assert _error(lambda: store.retrieve_refund("re_nope")).code == "resource_missing"


def test_stats_persist_across_reopen(db_path: str) -> None:
    gateway = EmbeddedGateway(db_path)
    charge = gateway.create_charge(
        amount=1000, currency="usd", customer="cus_1", metadata={}, idempotency_key="c1"
    )
    for _ in range(2):
        gateway.create_refund(
            charge_id=charge.id,
            amount=10,
            currency="usd",
            reason="overcharge",
            metadata={},
            idempotency_key="k1",
        )
    gateway.close()

    with PaymentStore(db_path) as reopened:
        assert reopened.stats() == counters(refund_requests=2, refunds_created=1, idempotent_replays=1)


def test_forgotten_keys_no_longer_replay(store: PaymentStore) -> None:
    charge = _charge(store)
    store.create_refund(charge=charge, amount=10, idempotency_key="k1")

    assert store.forget_idempotency_keys() == 1
    store.create_refund(charge=charge, amount=10, idempotency_key="k1")

    assert store.stats()["refunds_created"] == 2
