"""Customers and balance transactions through the gateway seam: the same contract for the embedded
provider and for the simulator reached through the official stripe SDK, plus the faults only the
HTTP path has (lost responses, injected 500s, rate limits, in-flight keys)."""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import stripe

from durable_assets import errors
from durable_assets.payments.gateway import (
    BalanceTransaction,
    Customer,
    CustomerGateway,
    EmbeddedGateway,
    StripeGateway,
    gateway_from_settings,
)
from durable_assets_testing.simulator import SimulatorServer
from tests.support.polling import wait_until
from tests.support.simulator import SimulatorProcess

API_KEY = "sk_test_customers"
AUTH = {"Authorization": f"Bearer {API_KEY}"}


@pytest.fixture(params=["embedded", "stripe"])
def gateway(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[EmbeddedGateway | StripeGateway]:
    """Both gateways, page size 2 so that every list is read across several pages."""
    if request.param == "embedded":
        embedded = EmbeddedGateway(str(tmp_path / "embedded.db"), page_size=2)
        yield embedded
        embedded.close()
        return
    sim: SimulatorServer = request.getfixturevalue("sim")
    yield StripeGateway(sim.url, API_KEY, timeout_s=10, page_size=2)


@pytest.fixture
def sdk_gateway(sim: SimulatorServer) -> StripeGateway:
    return StripeGateway(sim.url, API_KEY, timeout_s=10, page_size=2)


def _customer(
    gateway: CustomerGateway, account: str = "L1", email: str | None = "ada@example.com"
) -> Customer:
    return gateway.create_customer(
        email=email,
        name="Ada",
        metadata={"legacy_account_id": account},
        idempotency_key=f"customer-{account}",
    )


def _move(
    gateway: CustomerGateway, customer: Customer, amount: int, key: str, currency: str = "usd"
) -> BalanceTransaction:
    return gateway.create_balance_transaction(
        customer_id=customer.id,
        amount=amount,
        currency=currency,
        description="legacy credit",
        metadata={"legacy_account_id": str(customer.metadata.get("legacy_account_id"))},
        idempotency_key=key,
    )


# --- the contract both gateways share ------------------------------------------------------------


def test_customer_round_trip(gateway: EmbeddedGateway | StripeGateway) -> None:
    created = _customer(gateway)

    assert created.id.startswith("cus_")
    assert (created.email, created.name, created.balance, created.currency) == (
        "ada@example.com",
        "Ada",
        0,
        None,
    )
    assert created.metadata == {"legacy_account_id": "L1", "idempotency_key": "customer-L1"}
    assert created.idempotency_key == "customer-L1"
    assert gateway.retrieve_customer(created.id) == created
    assert _customer(gateway) == created  # same key, same parameters: the same customer
    assert gateway.stats()["customers_created"] == 1
    assert gateway.stats()["idempotent_replays"] == 1


def test_balance_moves_once_per_key_and_keeps_one_currency(gateway: EmbeddedGateway | StripeGateway) -> None:
    customer = _customer(gateway)
    credit = _move(gateway, customer, -5000, "credit-L1-1")

    assert credit.id.startswith("cbtxn_")
    assert (credit.customer_id, credit.amount, credit.currency, credit.ending_balance) == (
        customer.id,
        -5000,
        "usd",
        -5000,
    )
    assert (credit.type, credit.description, credit.idempotency_key) == (
        "adjustment",
        "legacy credit",
        "credit-L1-1",
    )
    assert _move(gateway, customer, -5000, "credit-L1-1") == credit  # replayed, not applied again
    assert _move(gateway, customer, 1500, "credit-L1-2").ending_balance == -3500
    with pytest.raises(errors.ProviderRejectedError) as other_currency:
        _move(gateway, customer, -1, "credit-L1-3", currency="EUR")
    with pytest.raises(errors.IdempotencyKeyMismatchError):
        _move(gateway, customer, -4999, "credit-L1-1")

    after = gateway.retrieve_customer(customer.id)
    assert (after.balance, after.currency) == (-3500, "usd")
    assert other_currency.value.http_status == 400
    stats = gateway.stats()
    assert (stats["balance_transactions_created"], stats["idempotent_replays"]) == (2, 1)


def test_the_customers_list_carries_balances_and_sends_each_page_through_the_caller(
    gateway: EmbeddedGateway | StripeGateway,
) -> None:
    """The migration plans and verifies from the list, pacing each page itself: every balance and
    currency must be there, and every page's request must go through ``send``."""
    customers = [_customer(gateway, f"L{i}", email=f"user{i}@example.com") for i in range(5)]
    _move(gateway, customers[1], -1250, "move-1")
    _move(gateway, customers[3], 700, "move-3", currency="eur")
    sent: list[object] = []

    def send(request: Callable[[], object]) -> object:
        answer = request()
        sent.append(answer)
        return answer

    listed = {c.id: (c.balance, c.currency) for c in gateway.list_customers(send=send)}

    assert listed == {
        **{c.id: (0, None) for c in customers},
        customers[1].id: (-1250, "usd"),
        customers[3].id: (700, "eur"),
    }
    assert len(sent) == 3  # page size 2: five customers in three requests
    newest = gateway.list_customers(send=send, max_pages=2)  # a reader that asks for the rest by id
    assert [c.id for c in newest] == [c.id for c in reversed(customers)][:4] and len(sent) == 5


def test_lists_read_every_page(gateway: EmbeddedGateway | StripeGateway) -> None:
    customers = [_customer(gateway, f"L{i}", email=f"user{i % 2}@example.com") for i in range(5)]
    moves = [_move(gateway, customers[0], -(i + 1), f"move-{i}") for i in range(5)]

    assert [c.id for c in gateway.list_customers()] == [c.id for c in reversed(customers)]
    assert [c.id for c in gateway.list_customers(email="user0@example.com")] == [
        customers[4].id,
        customers[2].id,
        customers[0].id,
    ]
    assert gateway.list_balance_transactions(customers[0].id) == list(reversed(moves))
    assert gateway.list_balance_transactions(customers[1].id) == []


def test_find_customer_by_metadata(gateway: EmbeddedGateway | StripeGateway) -> None:
    customers = [_customer(gateway, f"L{i}", email="shared@example.com") for i in range(4)]

    assert gateway.find_customer(metadata_key="legacy_account_id", value="L2") == customers[2]
    assert (
        gateway.find_customer(metadata_key="legacy_account_id", value="L2", email="shared@example.com")
        == (customers[2])
    )
    assert (
        gateway.find_customer(metadata_key="legacy_account_id", value="L2", email="other@example.com") is None
    )
    assert gateway.find_customer(metadata_key="legacy_account_id", value="L9") is None

    gateway.create_customer(
        email=None, name=None, metadata={"legacy_account_id": "L2"}, idempotency_key="dup"
    )
    with pytest.raises(errors.ProviderResponseMismatchError, match="2 customers"):
        gateway.find_customer(metadata_key="legacy_account_id", value="L2")


def test_errors_map_the_same_way(gateway: EmbeddedGateway | StripeGateway) -> None:
    customer = _customer(gateway)

    with pytest.raises(errors.ProviderRejectedError) as missing:
        gateway.retrieve_customer("cus_missing")
    with pytest.raises(errors.ProviderRejectedError) as missing_owner:
        _move(gateway, Customer("cus_missing", None, None, 0, None), -1, "k-missing")
    with pytest.raises(errors.ProviderRejectedError) as zero:
        _move(gateway, customer, 0, "k-zero")
    with pytest.raises(errors.ProviderRejectedError) as bad_email:
        gateway.create_customer(email="not-an-email", name=None, metadata={}, idempotency_key="k-email")
    with pytest.raises(errors.UsageError):  # the gateway owns metadata["idempotency_key"]
        gateway.create_customer(email=None, name=None, metadata={"idempotency_key": "x"}, idempotency_key="y")

    assert (missing.value.http_status, missing.value.code) == (404, "resource_missing")
    assert (missing_owner.value.http_status, missing_owner.value.code) == (404, "resource_missing")
    assert (zero.value.http_status, bad_email.value.http_status) == (400, 400)
    assert bad_email.value.code == "email_invalid"


def test_gateway_from_settings_serves_customers(tmp_path: Path, sim: SimulatorServer) -> None:
    embedded = gateway_from_settings(None, None, str(tmp_path / "p.db"))
    remote = gateway_from_settings(sim.url, API_KEY, str(tmp_path / "unused.db"))

    for gateway in (embedded, remote):
        customer = _customer(gateway)
        assert gateway.retrieve_customer(customer.id).email == "ada@example.com"


# --- faults, through the SDK against the simulator -----------------------------------------------


def test_lost_response_after_commit_then_resend_moves_the_balance_once(
    sim: SimulatorServer, sdk_gateway: StripeGateway
) -> None:
    customer = _customer(sdk_gateway)
    sim.configure(lost_response_rate=1.0)

    with pytest.raises(errors.TransientProviderError):
        _move(sdk_gateway, customer, -2500, "credit-lost")
    committed = sdk_gateway.list_balance_transactions(customer.id)  # GETs are never dropped
    sim.configure(lost_response_rate=0.0)
    resent = _move(sdk_gateway, customer, -2500, "credit-lost")

    assert [transaction.id for transaction in committed] == [resent.id]
    assert sdk_gateway.retrieve_customer(customer.id).balance == -2500
    stats = sdk_gateway.stats()
    assert (stats["balance_transactions_created"], stats["idempotent_replays"]) == (1, 1)


def test_lost_customer_creation_then_resend_gives_the_same_customer(
    sim: SimulatorServer, sdk_gateway: StripeGateway
) -> None:
    sim.configure(lost_response_rate=1.0)
    with pytest.raises(errors.TransientProviderError):
        _customer(sdk_gateway)
    sim.configure(lost_response_rate=0.0)

    resent = _customer(sdk_gateway)

    assert [customer.id for customer in sdk_gateway.list_customers()] == [resent.id]
    assert sdk_gateway.stats()["customers_created"] == 1


def test_injected_500_processes_nothing(sim: SimulatorServer, sdk_gateway: StripeGateway) -> None:
    customer = _customer(sdk_gateway)
    sim.configure(error_rate=1.0)

    with pytest.raises(errors.TransientProviderError) as failed:
        _move(sdk_gateway, customer, -100, "credit-500")
    with pytest.raises(errors.TransientProviderError):
        _customer(sdk_gateway, "L2")
    sim.configure(error_rate=0.0)

    assert failed.value.http_status == 500
    assert sdk_gateway.retrieve_customer(customer.id).balance == 0
    assert _move(sdk_gateway, customer, -100, "credit-500").ending_balance == -100  # the retry runs afresh
    assert sdk_gateway.stats()["idempotent_replays"] == 0


def test_rate_limit_applies_to_customer_routes(sim: SimulatorServer, sdk_gateway: StripeGateway) -> None:
    customer = _customer(sdk_gateway)
    sim.configure(rate_limit=0.5)  # a burst of one request, then one every 2 s

    sdk_gateway.retrieve_customer(customer.id)
    with pytest.raises(errors.TransientProviderError) as limited:
        _move(sdk_gateway, customer, -1, "credit-429")

    assert limited.value.http_status == 429
    assert limited.value.retry_after == 2.0
    sim.configure(rate_limit=None)
    assert sdk_gateway.retrieve_customer(customer.id).balance == 0


def test_latency_and_an_in_flight_key_get_409(sim: SimulatorServer, sdk_gateway: StripeGateway) -> None:
    customer = _customer(sdk_gateway)
    sim.configure(latency_ms=800)
    first: list[BalanceTransaction] = []
    holder = threading.Thread(target=lambda: first.append(_move(sdk_gateway, customer, -7, "credit-busy")))
    started = time.monotonic()
    holder.start()
    wait_until(
        lambda: sim.in_flight_count() == 1, timeout=5, interval=0.005, what="the first request in flight"
    )

    with pytest.raises(errors.IdempotencyKeyInFlightError):
        _move(sdk_gateway, customer, -7, "credit-busy")
    holder.join(timeout=10)
    sim.configure(latency_ms=0)

    assert time.monotonic() - started >= 0.8  # the latency applied to this route too
    assert _move(sdk_gateway, customer, -7, "credit-busy") == first[0]
    assert sdk_gateway.retrieve_customer(customer.id).balance == -7


# --- the wire, as the SDK and curl see it ----------------------------------------------------------


def test_every_customer_field_reads_through_the_sdk(sim: SimulatorServer) -> None:
    client = stripe.StripeClient(API_KEY, base_addresses={"api": sim.url}, max_network_retries=0)
    customer = client.v1.customers.create(
        params={"email": "ada@example.com", "name": "Ada", "metadata": {"legacy_account_id": "L1"}},
        options={"idempotency_key": "c1"},
    )
    move = client.v1.customers.balance_transactions.create(
        customer.id, params={"amount": -500, "currency": "usd"}, options={"idempotency_key": "m1"}
    )
    expanded = client.v1.customers.balance_transactions.list(
        customer.id, params={"expand": ["data.customer"], "limit": 1}
    )
    pages = list(client.v1.customers.list(params={"limit": 1}).auto_paging_iter())

    assert isinstance(customer, stripe.Customer) and isinstance(move, stripe.CustomerBalanceTransaction)
    assert customer.invoice_settings.custom_fields is None
    assert customer.preferred_locales == [] and customer.tax_exempt == "none"
    assert (move.amount, move.ending_balance, move.customer, move.type) == (
        -500,
        -500,
        customer.id,
        "adjustment",
    )
    assert isinstance(expanded.data[0].customer, stripe.Customer)
    assert expanded.data[0].customer.balance == -500
    assert [page.id for page in pages] == [customer.id]


def test_replay_headers_and_form_encoding(sim: SimulatorServer) -> None:
    with httpx.Client(base_url=sim.url, timeout=10, headers=AUTH) as http:
        customer = http.post("/v1/customers", data={"email": "a@b.c"}).json()
        path = f"/v1/customers/{customer['id']}/balance_transactions"
        data: dict[str, Any] = {"amount": "-10", "currency": "usd", "metadata[idempotency_key]": "k"}
        first = http.post(path, data=data, headers={"Idempotency-Key": "k"})
        again = http.post(path, data=data, headers={"Idempotency-Key": "k"})
        stats = http.get("/_sim/stats").json()

    assert (first.status_code, again.status_code) == (200, 200)
    assert "Idempotent-Replayed" not in first.headers
    assert again.headers["Idempotent-Replayed"] == "true"
    assert again.json() == first.json()
    assert stats["customers_created"] == 1 and stats["balance_transactions_created"] == 1


def test_real_job_provider_serve_loses_every_answer_and_moves_the_balance_once(tmp_path: Path) -> None:
    """The real command with ``--lost-response-rate 1``: every POST commits, then the connection
    drops. Sending the same key three times still leaves one transaction and one balance move."""
    command = [sys.executable, "-c", "from durable_assets.ops.cli import main; raise SystemExit(main())"]
    options = ["--lost-response-rate", "1", "--seed", "1"]
    server = SimulatorProcess(tmp_path / "cli.db", *options, command=command, timeout=30)
    try:
        gateway = StripeGateway(server.url, API_KEY, timeout_s=10)
        with pytest.raises(errors.TransientProviderError):
            _customer(gateway)
        [customer] = gateway.list_customers()  # committed before the answer was lost
        for _ in range(3):
            with pytest.raises(errors.TransientProviderError):
                _move(gateway, customer, -1234, "credit-real-process")
        transactions = gateway.list_balance_transactions(customer.id)
        balance = gateway.retrieve_customer(customer.id).balance
        stats = gateway.stats()
    finally:
        server.stop()
    stderr = server.output

    assert [(t.amount, t.idempotency_key) for t in transactions] == [(-1234, "credit-real-process")], stderr
    assert balance == -1234
    assert (
        stats["customers_created"],
        stats["balance_transactions_created"],
        stats["idempotent_replays"],
    ) == (
        1,
        1,
        2,
    )
