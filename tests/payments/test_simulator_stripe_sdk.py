"""The HTTP simulator driven by the official stripe SDK (through StripeGateway), plus the gateway
contract both gateways must honour identically."""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import pytest

from durable_assets.errors import (
    IdempotencyKeyInFlightError,
    IdempotencyKeyMismatchError,
    ProviderRejectedError,
    ProviderResponseMismatchError,
    TransientProviderError,
    UsageError,
)
from durable_assets.payments.gateway import (
    EmbeddedGateway,
    RefundGateway,
    StripeGateway,
    gateway_from_settings,
)
from durable_assets.payments.simulator import SimulatorServer, build_server

API_KEY = "sk_test_simulator"
AUTH = {"Authorization": f"Bearer {API_KEY}"}


def _start(server: ThreadingHTTPServer) -> threading.Thread:
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True)
    thread.start()
    return thread


@pytest.fixture
def sim(tmp_path: Path) -> Iterator[SimulatorServer]:
    server = build_server("127.0.0.1", 0, str(tmp_path / "sim.db"), seed=7)
    thread = _start(server)
    yield server
    server.shutdown()
    server.server_close()
    thread.join(timeout=5)


@pytest.fixture
def gateway(sim: SimulatorServer) -> StripeGateway:
    return StripeGateway(sim.url, API_KEY, timeout_s=10)


@pytest.fixture
def http(sim: SimulatorServer) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=sim.url, timeout=10) as client:
        yield client


def _wait_for(condition: Callable[[], bool], timeout_s: float = 5.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError("condition not reached before the deadline")
        time.sleep(0.005)


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
    assert gateway.stats() == {"refund_requests": 1, "refunds_created": 1, "idempotent_replays": 0}


def test_replay_returns_the_same_refund(gateway: StripeGateway) -> None:
    charge_id = _charge(gateway)

    first = _refund(gateway, charge_id, "r1")
    second = _refund(gateway, charge_id, "r1")

    assert second == first
    assert gateway.stats() == {"refund_requests": 2, "refunds_created": 1, "idempotent_replays": 1}


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
    _wait_for(lambda: sim.in_flight_count() == 1)

    with pytest.raises(IdempotencyKeyInFlightError):
        _refund(gateway, charge_id, "r1")
    holder.join(timeout=10)
    sim.configure(latency_ms=0)

    assert _refund(gateway, charge_id, "r1") == first[0]
    assert gateway.stats() == {"refund_requests": 3, "refunds_created": 1, "idempotent_replays": 1}


def test_lost_response_then_retry_with_same_key(sim: SimulatorServer, gateway: StripeGateway) -> None:
    charge_id = _charge(gateway)
    sim.configure(lost_response_rate=1.0)

    with pytest.raises(TransientProviderError) as lost:
        _refund(gateway, charge_id, "r1")
    sim.configure(lost_response_rate=0.0)
    committed = gateway.find_refund_by_key(charge_id=charge_id, idempotency_key="r1")
    retried = _refund(gateway, charge_id, "r1")

    assert lost.value.http_status is None
    assert committed is not None and retried == committed
    assert gateway.stats() == {"refund_requests": 2, "refunds_created": 1, "idempotent_replays": 1}


def test_injected_500_processes_nothing(sim: SimulatorServer, gateway: StripeGateway) -> None:
    charge_id = _charge(gateway)
    sim.configure(error_rate=1.0)

    with pytest.raises(TransientProviderError) as failed:
        _refund(gateway, charge_id, "r1")
    sim.configure(error_rate=0.0)
    _refund(gateway, charge_id, "r1")

    assert failed.value.http_status == 500
    assert gateway.stats() == {"refund_requests": 2, "refunds_created": 1, "idempotent_replays": 0}


def test_rate_limit_answers_429_with_retry_after(sim: SimulatorServer, gateway: StripeGateway) -> None:
    sim.configure(rate_limit=0.5)  # a burst of one request, then one every two seconds
    charge_id = _charge(gateway)

    with pytest.raises(TransientProviderError) as limited:
        _refund(gateway, charge_id, "r1")

    assert limited.value.http_status == 429
    assert limited.value.retry_after is not None and 1.0 < limited.value.retry_after <= 2.0
    assert gateway.stats() == {"refund_requests": 1, "refunds_created": 0, "idempotent_replays": 0}


def test_rate_limit_headers_and_body(sim: SimulatorServer, http: httpx.Client) -> None:
    sim.configure(rate_limit=0.5)
    http.get("/v1/refunds", headers=AUTH)

    response = http.get("/v1/refunds", headers=AUTH)

    assert response.status_code == 429
    assert 1.0 < float(response.headers["Retry-After"]) <= 2.0
    assert response.headers["Stripe-Should-Retry"] == "true"
    assert response.json()["error"]["code"] == "rate_limit"


def test_missing_api_key_is_401(sim: SimulatorServer, http: httpx.Client) -> None:
    response = http.post("/v1/refunds", data={"charge": "ch_x"})

    with pytest.raises(ProviderRejectedError) as rejected:
        _refund(StripeGateway(sim.url, ""), "ch_x", "r1")

    assert response.status_code == 401
    assert response.json()["error"]["type"] == "invalid_request_error"
    assert rejected.value.http_status == 401
    assert http.get("/healthz").status_code == 200


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
        server = build_server("127.0.0.1", 0, str(tmp_path / name), error_rate=0.5, seed=42)
        thread = _start(server)
        try:
            with httpx.Client(base_url=server.url, timeout=10) as client:
                return [client.get("/v1/refunds", headers=AUTH).status_code for _ in range(20)]
        finally:
            server.shutdown()
            server.server_close()
            thread.join(timeout=5)

    first = outcomes("a.db")

    assert first == outcomes("b.db")
    assert set(first) == {200, 500}


def test_unreachable_provider_is_transient() -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    gateway = StripeGateway(f"http://127.0.0.1:{port}", API_KEY, timeout_s=2)

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
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = _start(server)
    try:
        gateway = StripeGateway(f"http://127.0.0.1:{server.server_address[1]}", API_KEY)
        with pytest.raises(ProviderResponseMismatchError):
            _refund(gateway, "ch_1", "r1", amount=100)
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)


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
