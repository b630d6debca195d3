"""The HTTP simulator driven by the official stripe SDK (through StripeGateway), plus the gateway
contract both gateways must honour identically."""

from __future__ import annotations

import json
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import pytest
import stripe

from durable_assets.errors import (
    IdempotencyKeyInFlightError,
    IdempotencyKeyMismatchError,
    ProviderRejectedError,
    ProviderResponseMismatchError,
    TransientProviderError,
    UsageError,
)
from durable_assets.ops.cli import build_parser
from durable_assets.payments.gateway import (
    EmbeddedGateway,
    RefundGateway,
    StripeGateway,
    gateway_from_settings,
)
from durable_assets_testing.simulator import SimulatorServer, build_server, format_retry_after
from tests.support.counters import counters
from tests.support.network import ServedInThread, free_port
from tests.support.polling import wait_until
from tests.support.simulator import SimulatorProcess, ThreadedSimulator

API_KEY = "sk_test_simulator"
AUTH = {"Authorization": f"Bearer {API_KEY}"}


@pytest.fixture
def gateway(sim: SimulatorServer) -> StripeGateway:
    return StripeGateway(sim.url, API_KEY, timeout_s=10)


@pytest.fixture
def http(sim: SimulatorServer) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=sim.url, timeout=10) as client:
        yield client


def _charge(gateway: RefundGateway, amount: int = 1000, key: str = "charge-1") -> str:
    charge = gateway.create_charge(
        amount=amount, currency="usd", customer="cus_1", metadata={"invoice": "inv_1"}, idempotency_key=key
    )
    return charge.id


def _refund(
    gateway: RefundGateway, charge_id: str, key: str, amount: int = 100, reason: str = "other"
) -> Any:
    return gateway.create_refund(
        charge_id=charge_id,
        amount=amount,
        currency="usd",
        reason=reason,
        metadata={"invoice": "inv_1"},
        idempotency_key=key,
    )


# --- the simulator through the SDK ---------------------------------------------------------------


def test_charge_and_refund_round_trip(sim: SimulatorServer, gateway: StripeGateway) -> None:
    charge = gateway.create_charge(
        amount=1000, currency="USD", customer="cus_1", metadata={"invoice": "inv_1"}, idempotency_key="c1"
    )
    refund = _refund(gateway, charge.id, "r1", amount=250, reason="duplicate_charge")

    assert (charge.amount, charge.currency, charge.metadata["idempotency_key"]) == (1000, "usd", "c1")
    assert (refund.amount, refund.currency, refund.charge_id, refund.status) == (
        250,
        "usd",
        charge.id,
        "succeeded",
    )
    assert (refund.reason, refund.durable_reason, refund.idempotency_key) == (
        "duplicate",
        "duplicate_charge",
        "r1",
    )
    assert gateway.retrieve_refund(refund.id) == refund
    # requests: every request the test sent, whatever its answer (so in every test below)
    assert gateway.stats() == counters(refund_requests=1, refunds_created=1, requests=3)


def test_replay_returns_the_same_refund(gateway: StripeGateway) -> None:
    charge_id = _charge(gateway)

    first = _refund(gateway, charge_id, "r1")
    second = _refund(gateway, charge_id, "r1")

    assert second == first
    assert gateway.stats() == counters(refund_requests=2, refunds_created=1, idempotent_replays=1, requests=3)


def test_same_key_different_amount_is_a_mismatch(gateway: StripeGateway) -> None:
    charge_id = _charge(gateway)
    _refund(gateway, charge_id, "r1", amount=100)

    with pytest.raises(IdempotencyKeyMismatchError):
        _refund(gateway, charge_id, "r1", amount=101)

    assert gateway.stats()["refunds_created"] == 1


def test_second_request_with_an_in_flight_key_gets_409(sim: SimulatorServer, gateway: StripeGateway) -> None:
    charge_id = _charge(gateway)
    sim.configure(latency_ms=1000)
    first: list[Any] = []
    holder = threading.Thread(target=lambda: first.append(_refund(gateway, charge_id, "r1")))
    holder.start()
    wait_until(
        lambda: sim.in_flight_count() == 1, timeout=5, interval=0.005, what="the first request in flight"
    )

    with pytest.raises(IdempotencyKeyInFlightError):
        _refund(gateway, charge_id, "r1")
    holder.join(timeout=10)
    sim.configure(latency_ms=0)

    assert _refund(gateway, charge_id, "r1") == first[0]
    assert gateway.stats() == counters(refund_requests=3, refunds_created=1, idempotent_replays=1, requests=4)


@pytest.mark.parametrize(
    ("fault", "status", "committed"),
    [("lost_response_rate", None, True), ("error_rate", 500, False)],
    ids=["lost response: committed, then replayed", "injected 500: nothing processed"],
)
def test_a_failed_request_retried_with_its_key_refunds_once(
    sim: SimulatorServer, gateway: StripeGateway, fault: str, status: int | None, committed: bool
) -> None:
    charge_id = _charge(gateway)
    sim.configure(**{fault: 1.0})

    with pytest.raises(TransientProviderError) as failed:
        _refund(gateway, charge_id, "r1")
    sim.configure(**{fault: 0.0})
    found = gateway.find_refund_by_key(charge_id=charge_id, idempotency_key="r1")
    retried = _refund(gateway, charge_id, "r1")

    assert failed.value.http_status == status
    assert found == (retried if committed else None)
    replays = 1 if committed else 0  # a lost answer's refund exists: the retry replays it
    assert gateway.stats() == counters(
        refund_requests=2, refunds_created=1, idempotent_replays=replays, requests=4
    )


def test_rate_limit_answers_429_with_retry_after(sim: SimulatorServer, gateway: StripeGateway) -> None:
    sim.configure(rate_limit=0.5)  # a burst of one request, then one every two seconds
    charge_id = _charge(gateway)

    with pytest.raises(TransientProviderError) as limited:
        _refund(gateway, charge_id, "r1")

    assert limited.value.http_status == 429
    assert limited.value.retry_after is not None and 1.0 < limited.value.retry_after <= 2.0
    assert gateway.stats() == counters(refund_requests=1, requests=2, rate_limited=1)


def test_rate_limit_headers_and_body(sim: SimulatorServer, http: httpx.Client) -> None:
    sim.configure(rate_limit=0.5)
    http.get("/v1/refunds", headers=AUTH)

    response = http.get("/v1/refunds", headers=AUTH)

    assert response.status_code == 429
    assert response.headers["Retry-After"] == "2"  # whole seconds (RFC 9110), rounded up
    assert response.headers["Stripe-Should-Retry"] == "true"
    assert response.json()["error"]["code"] == "rate_limit"


def test_retry_after_is_whole_seconds_rounded_up() -> None:
    waits = (0.0, 0.001, 0.05, 1.0, 1.2, 2.0)
    assert [format_retry_after(wait) for wait in waits] == ["1", "1", "1", "1", "2", "2"]


def test_missing_api_key_is_401(sim: SimulatorServer, http: httpx.Client) -> None:
    response = http.post("/v1/refunds", data={"charge": "ch_x"})

    with pytest.raises(ProviderRejectedError) as rejected:
        _refund(StripeGateway(sim.url, ""), "ch_x", "r1")

    assert response.status_code == 401
    assert response.json()["error"]["type"] == "invalid_request_error"
    assert response.json()["error"]["message"].startswith("You did not provide an API key.")
    assert rejected.value.http_status == 401
    assert http.get("/healthz").status_code == 200


def test_unknown_api_key_is_401_and_counts_nothing(sim: SimulatorServer, http: httpx.Client) -> None:
    """By default any test-mode secret key passes; anything else is unknown, as at Stripe."""
    wrong = http.post("/v1/refunds", data={"charge": "ch_x"}, headers={"Authorization": "Bearer nope1234"})
    live = http.get("/v1/refunds", headers={"Authorization": "Bearer sk_live_abcdefgh"})

    with pytest.raises(ProviderRejectedError) as rejected:
        _refund(StripeGateway(sim.url, "rk_test_1234567890"), "ch_x", "r1")

    assert wrong.status_code == live.status_code == 401
    assert wrong.json() == {
        "error": {"type": "invalid_request_error", "message": "Invalid API Key provided: ****1234"}
    }
    assert live.json()["error"]["message"] == "Invalid API Key provided: sk_live_****efgh"
    assert wrong.headers["WWW-Authenticate"] == 'Basic realm="Stripe"'
    assert rejected.value.http_status == 401
    assert sim.store.stats()["refund_requests"] == 0


def test_api_key_option_accepts_only_the_given_keys(tmp_path: Path) -> None:
    args = build_parser().parse_args(["provider", "serve", "--api-key", "sk_test_a", "--api-key", "key_b"])
    with (
        ThreadedSimulator(tmp_path / "keys.db", api_keys=args.api_keys) as server,
        httpx.Client(base_url=server.url, timeout=10) as client,
    ):
        statuses = {
            key: client.get("/v1/refunds", headers={"Authorization": f"Bearer {key}"}).status_code
            for key in ("sk_test_a", "key_b", "sk_test_other")
        }

    assert statuses == {"sk_test_a": 200, "key_b": 200, "sk_test_other": 401}
    with pytest.raises(UsageError):
        build_server("127.0.0.1", 0, str(tmp_path / "bad.db"), api_keys=["has space"])


def test_job_provider_serve_takes_api_keys(tmp_path: Path) -> None:
    """The real command, so the option reaches the server and not only the parser."""
    command = [sys.executable, "-c", "from durable_assets.ops.cli import main; raise SystemExit(main())"]
    server = SimulatorProcess(tmp_path / "cli.db", "--api-key", "rk_test_cli", command=command, timeout=30)
    try:
        with httpx.Client(base_url=server.url, timeout=10) as client:
            accepted = client.get("/v1/refunds", auth=("rk_test_cli", ""))
            default_key = client.get("/v1/refunds", headers=AUTH)
    finally:
        server.stop()
    stderr = server.output

    assert (accepted.status_code, default_key.status_code) == (200, 401), stderr
    assert default_key.json()["error"]["message"].startswith("Invalid API Key provided: sk_test_")


def test_http_basic_with_the_key_as_user(sim: SimulatorServer, http: httpx.Client) -> None:
    """``curl -u sk_test_x:``, the form in Stripe's docs."""
    accepted = http.get("/v1/refunds", auth=(API_KEY, ""))
    unknown = http.get("/v1/refunds", auth=("nope", ""))
    malformed = http.get("/v1/refunds", headers={"Authorization": "Basic !!!"})

    assert accepted.status_code == 200 and accepted.json()["object"] == "list"
    assert (unknown.status_code, malformed.status_code) == (401, 401)


def test_find_refund_by_key_pages_through_all_refunds(sim: SimulatorServer) -> None:
    gateway = StripeGateway(sim.url, API_KEY, page_size=2)
    charge_id = _charge(gateway)
    refunds = [_refund(gateway, charge_id, f"r{index}", amount=10) for index in range(5)]
    sim.store.forget_idempotency_keys()  # the provider forgot the keys; the metadata remembers

    assert gateway.find_refund_by_key(charge_id=charge_id, idempotency_key="r0") == refunds[0]
    assert gateway.find_refund_by_key(charge_id=charge_id, idempotency_key="r9") is None


def test_form_encoding_and_stripe_headers(http: httpx.Client, gateway: StripeGateway) -> None:
    charge_id = _charge(gateway)
    form = {"charge": charge_id, "amount": "42", "metadata[order]": "o-1", "metadata[note]": "a b&c"}
    headers = {**AUTH, "Idempotency-Key": "raw-1"}

    first = http.post("/v1/refunds", data=form, headers=headers)
    second = http.post("/v1/refunds", data=form, headers=headers)
    unknown = http.post("/v1/refunds", data={**form, "color": "red"}, headers=AUTH)
    listed = http.get("/v1/refunds", params={"charge": charge_id, "limit": "1"}, headers=AUTH)

    assert first.status_code == second.status_code == 200
    assert first.json()["metadata"] == {"note": "a b&c", "order": "o-1"}
    assert second.content == first.content
    assert second.headers["Idempotent-Replayed"] == "true" and "Idempotent-Replayed" not in first.headers
    assert (unknown.status_code, unknown.json()["error"]["code"]) == (400, "parameter_unknown")
    assert [refund["id"] for refund in listed.json()["data"]] == [first.json()["id"]]


def test_faults_are_deterministic_for_a_seed(tmp_path: Path) -> None:
    def outcomes(name: str) -> list[int]:
        with (
            ThreadedSimulator(tmp_path / name, error_rate=0.5, seed=42) as server,
            httpx.Client(base_url=server.url, timeout=10) as client,
        ):
            return [client.get("/v1/refunds", headers=AUTH).status_code for _ in range(20)]

    first = outcomes("a.db")

    assert first == outcomes("b.db")
    assert set(first) == {200, 500}


def test_unreachable_provider_is_transient() -> None:
    gateway = StripeGateway(f"http://127.0.0.1:{free_port()}", API_KEY, timeout_s=2)

    with pytest.raises(TransientProviderError) as unreachable:
        gateway.retrieve_refund("re_1")

    assert unreachable.value.http_status is None


class _WrongAnswerHandler(BaseHTTPRequestHandler):
    """A provider that answers 200 with something that is not what was asked for."""

    body = b"{}"

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(self.body)))
        self.end_headers()
        self.wfile.write(self.body)

    def log_message(self, format: str, *args: Any) -> None:
        pass


@pytest.mark.parametrize(
    "body",
    [
        {"object": "charge", "id": "ch_1", "amount": 100},
        {
            "object": "refund",
            "id": "re_1",
            "amount": 999,
            "charge": "ch_1",
            "currency": "usd",
            "status": "succeeded",
        },
        "not json",
    ],
    ids=["wrong-object", "wrong-amount", "not-json"],
)
def test_answers_that_do_not_match_the_request_fail_closed(body: object) -> None:
    handler = type(
        "Handler",
        (_WrongAnswerHandler,),
        {"body": (json.dumps(body) if body != "not json" else "{").encode()},
    )
    with ServedInThread(ThreadingHTTPServer(("127.0.0.1", 0), handler), poll_interval=0.02) as served:
        gateway = StripeGateway(f"http://127.0.0.1:{served.port}", API_KEY)
        with pytest.raises(ProviderResponseMismatchError):
            _refund(gateway, "ch_1", "r1", amount=100)


# --- the contract both gateways share ------------------------------------------------------------


@pytest.fixture(params=["embedded", "stripe"])
def any_gateway(request: pytest.FixtureRequest, tmp_path: Path) -> RefundGateway:
    if request.param == "embedded":
        return EmbeddedGateway(str(tmp_path / "embedded.db"))
    sim: SimulatorServer = request.getfixturevalue("sim")
    return StripeGateway(sim.url, API_KEY)


def test_gateways_behave_identically(any_gateway: RefundGateway) -> None:
    charge_id = _charge(any_gateway, amount=1000)
    refund = _refund(any_gateway, charge_id, "r1", amount=600)

    assert _refund(any_gateway, charge_id, "r1", amount=600) == refund
    with pytest.raises(IdempotencyKeyMismatchError):
        _refund(any_gateway, charge_id, "r1", amount=601)
    with pytest.raises(ProviderRejectedError) as too_large:
        _refund(any_gateway, charge_id, "r2", amount=401)
    with pytest.raises(ProviderRejectedError) as missing:
        _refund(any_gateway, "ch_missing", "r3")
    with pytest.raises(UsageError):
        any_gateway.create_refund(
            charge_id=charge_id,
            amount=1,
            currency="usd",
            reason="other",
            metadata={"idempotency_key": "not-r4"},
            idempotency_key="r4",
        )
    assert (too_large.value.http_status, too_large.value.code) == (400, "amount_too_large")
    assert (missing.value.http_status, missing.value.code) == (404, "resource_missing")
    assert any_gateway.find_refund_by_key(charge_id=charge_id, idempotency_key="r1") == refund
    assert any_gateway.retrieve_refund(refund.id) == refund


def test_gateway_from_settings(tmp_path: Path) -> None:
    embedded = gateway_from_settings(None, None, str(tmp_path / "embedded.db"))

    assert isinstance(embedded, EmbeddedGateway)
    assert isinstance(gateway_from_settings("http://127.0.0.1:12111", "sk_test", ""), StripeGateway)
    with pytest.raises(UsageError):
        gateway_from_settings("http://127.0.0.1:12111", None, "")


# --- Stripe's object fields, pagination and expansion --------------------------------------------


@pytest.fixture
def client(sim: SimulatorServer) -> stripe.StripeClient:
    """The bare SDK, to read fields the gateway does not map."""
    return stripe.StripeClient(
        API_KEY,
        base_addresses={"api": sim.url},
        max_network_retries=0,
        http_client=stripe.RequestsClient(timeout=10),
    )


def test_every_field_reads_through_the_sdk(client: stripe.StripeClient) -> None:
    charge = client.v1.charges.create(params={"amount": 1000, "currency": "usd"})
    refund = client.v1.refunds.create(params={"charge": charge.id, "amount": 300})

    assert charge.billing_details.address is not None and charge.billing_details.address.city is None
    assert (charge.disputed, charge.refunds.object, charge.refunds.data) == (False, "list", [])
    assert charge.refunds.url == f"/v1/charges/{charge.id}/refunds"
    assert charge.outcome is not None and charge.outcome.type == "authorized"
    assert [
        refund.balance_transaction,
        refund.payment_intent,
        refund.receipt_number,
        refund.transfer_reversal,
        refund.source_transfer_reversal,
        refund.destination_details,
    ] == [None] * 6


def test_expand_charge_on_refunds(client: stripe.StripeClient, http: httpx.Client) -> None:
    charge = client.v1.charges.create(params={"amount": 1000, "currency": "usd"})
    created = http.post(
        "/v1/refunds",
        data={"charge": charge.id, "amount": "100", "expand[]": "charge"},
        headers={**AUTH, "Idempotency-Key": "x1"},
    ).json()
    retrieved = client.v1.refunds.retrieve(created["id"], params={"expand": ["charge", "payment_intent"]})
    listed = client.v1.refunds.list(params={"charge": charge.id, "expand": ["data.charge"]})
    plain = client.v1.refunds.retrieve(created["id"])

    assert created["charge"]["object"] == "charge" and created["charge"]["amount_refunded"] == 100
    assert [r["id"] for r in created["charge"]["refunds"]["data"]] == [created["id"]]
    assert isinstance(retrieved.charge, stripe.Charge) and retrieved.charge.id == charge.id
    assert retrieved.payment_intent is None  # expandable, and null here: expanding changes nothing
    assert isinstance(listed.data[0].charge, stripe.Charge)
    assert plain.charge == charge.id


def test_expand_that_cannot_be_honoured_is_400_before_anything_happens(
    sim: SimulatorServer, client: stripe.StripeClient, http: httpx.Client
) -> None:
    charge = client.v1.charges.create(params={"amount": 1000, "currency": "usd", "customer": "cus_1"})
    unknown = http.post("/v1/refunds", data={"charge": charge.id, "expand[0]": "color"}, headers=AUTH)
    customer = http.post(
        "/v1/charges", data={"amount": "1", "currency": "usd", "expand[]": "customer"}, headers=AUTH
    )
    list_item = http.get("/v1/refunds", params={"expand[]": "charge"}, headers=AUTH)

    assert unknown.status_code == customer.status_code == list_item.status_code == 400
    assert unknown.json()["error"] == {
        "type": "invalid_request_error",
        "message": "This property cannot be expanded (color).",
        "param": "expand",
    }
    assert "customer" in customer.json()["error"]["message"]
    assert sim.store.stats()["refunds_created"] == 0


def test_ending_before_pages_back_towards_the_newest(client: stripe.StripeClient, http: httpx.Client) -> None:
    charge = client.v1.charges.create(params={"amount": 1000, "currency": "usd"})
    ids = [client.v1.refunds.create(params={"charge": charge.id, "amount": 10}).id for _ in range(5)]
    newest_first = ids[::-1]

    def page(**params: str) -> tuple[list[str], bool]:
        body = http.get("/v1/refunds", params={"limit": "2", **params}, headers=AUTH).json()
        return [refund["id"] for refund in body["data"]], body["has_more"]

    assert page(ending_before=ids[0]) == (newest_first[2:4], True)
    assert page(ending_before=newest_first[2]) == (newest_first[0:2], False)
    assert page(ending_before=newest_first[0]) == ([], False)
    assert page(starting_after=newest_first[1]) == (newest_first[2:4], True)
    both = http.get("/v1/refunds", params={"ending_before": ids[0], "starting_after": ids[1]}, headers=AUTH)
    missing = http.get("/v1/refunds", params={"ending_before": "re_nope"}, headers=AUTH)
    assert both.status_code == 400
    assert (missing.status_code, missing.json()["error"]["param"]) == (404, "ending_before")


def test_a_charge_and_its_refund_list_by_their_urls(client: stripe.StripeClient) -> None:
    """``charge.refunds.url`` is served, so the SDK can page a charge's refunds as at Stripe."""
    charge = client.v1.charges.create(params={"amount": 1000, "currency": "usd"})
    ids = [client.v1.refunds.create(params={"charge": charge.id, "amount": 10}).id for _ in range(3)]
    other = client.v1.charges.create(params={"amount": 1000, "currency": "usd"})
    client.v1.refunds.create(params={"charge": other.id, "amount": 10})

    retrieved = client.v1.charges.retrieve(charge.id)
    first_page = client.v1.charges.retrieve(charge.id).refunds
    paged = client.v1.refunds.list(params={"charge": charge.id, "limit": 2})
    by_url = [refund.id for refund in retrieved.refunds.auto_paging_iter()]

    assert (retrieved.amount_refunded, retrieved.refunded) == (30, False)
    assert [refund.id for refund in first_page.data] == ids[::-1] and first_page.has_more is False
    assert by_url == ids[::-1]
    assert [refund.id for refund in paged.auto_paging_iter()] == ids[::-1]
    with pytest.raises(stripe.InvalidRequestError):
        client.v1.charges.retrieve("ch_missing")


@pytest.mark.parametrize("sent", [0, 40])
def test_a_client_gone_mid_body_causes_nothing_and_its_retry_succeeds(
    sim: SimulatorServer, gateway: StripeGateway, sent: int
) -> None:
    """A worker killed while sending its request: the simulator must not act on a partial body (it
    would bind the key to parameters never sent, and refuse the real retry as a mismatch)."""
    import socket

    body = (
        "email=account0000042%40legacy.example.com&name=Legacy+Account+0000042"
        "&metadata[legacy_account_id]=LEG-0000042&metadata[idempotency_key]=customer-k1"
    )
    head = (
        "POST /v1/customers HTTP/1.1\r\nHost: 127.0.0.1\r\n"
        f"Authorization: Bearer {API_KEY}\r\nIdempotency-Key: customer-k1\r\n"
        "Content-Type: application/x-www-form-urlencoded\r\n"
        f"Content-Length: {len(body)}\r\n\r\n"
    )
    with socket.create_connection(("127.0.0.1", int(sim.server_address[1]))) as conn:
        conn.sendall(head.encode() + body[:sent].encode())
    wait_until(lambda: sim.in_flight_count() == 0, timeout=10, what="the dead client's connection to end")
    assert sim.store.stats()["customers_created"] == 0

    customer = gateway.create_customer(
        email="account0000042@legacy.example.com",
        name="Legacy Account 0000042",
        metadata={"legacy_account_id": "LEG-0000042"},
        idempotency_key="customer-k1",
    )
    assert customer.metadata["legacy_account_id"] == "LEG-0000042"
    assert sim.store.stats()["customers_created"] == 1
