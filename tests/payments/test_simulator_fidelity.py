"""Issue #34 item 6: the simulator as Stripe answers the official SDK's module-level API
(``stripe.Customer.modify``, ``stripe.Charge.list``, ...), which a client written for Stripe uses:
customer update, charge list, Stripe's currencies, a key bound to its first endpoint, and live keys
refused against the simulator's test-mode data."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import stripe

from durable_assets.errors import (
    IdempotencyKeyEndpointError,
    IdempotencyKeyMismatchError,
    ProviderRejectedError,
)
from durable_assets.payments.gateway import EmbeddedGateway, StripeGateway
from durable_assets_testing.simulator import LiveApiKeyError, SimulatorServer, build_server

API_KEY = "sk_test_fidelity"


@pytest.fixture
def sdk(sim: SimulatorServer, monkeypatch: pytest.MonkeyPatch) -> Iterator[SimulatorServer]:
    """The SDK's global configuration pointed at the simulator, restored after the test."""
    monkeypatch.setattr(stripe, "api_key", API_KEY)
    monkeypatch.setattr(stripe, "api_base", sim.url)
    monkeypatch.setattr(stripe, "max_network_retries", 0)
    yield sim


# --- customer update -----------------------------------------------------------------------------


def test_customer_modify_sets_merges_and_unsets_as_stripe_does(sdk: SimulatorServer) -> None:
    customer = stripe.Customer.create(
        email="ada@example.com", name="Ada", metadata={"keep": "1", "drop": "2"}
    )

    # The same update sent twice under one key: the second is the first's replay.
    update: dict[str, Any] = {
        "email": "ada@lovelace.example",
        "description": "first programmer",
        "metadata": {"drop": "", "new": "3"},
        "idempotency_key": "update-1",
    }
    changed = stripe.Customer.modify(customer.id, **update)
    replayed = stripe.Customer.modify(customer.id, **update)
    unset = stripe.Customer.modify(customer.id, name="", metadata="")

    assert (changed.email, changed.name, changed.description) == (
        "ada@lovelace.example",
        "Ada",
        "first programmer",
    )
    assert changed.metadata.to_dict() == {"keep": "1", "new": "3"}
    assert replayed.to_dict() == changed.to_dict()
    assert replayed.last_response.headers["Idempotent-Replayed"] == "true"
    assert (unset.email, unset.name, unset.description, unset.metadata.to_dict()) == (
        "ada@lovelace.example",
        None,
        "first programmer",
        {},
    )
    assert stripe.Customer.retrieve(customer.id).to_dict() == unset.to_dict()


def test_customer_modify_refuses_what_stripe_refuses(sdk: SimulatorServer) -> None:
    customer = stripe.Customer.create(email="a@example.com")
    stripe.Customer.delete(customer.id)

    with pytest.raises(stripe.InvalidRequestError) as deleted:
        stripe.Customer.modify(customer.id, name="x")
    with pytest.raises(stripe.InvalidRequestError) as bad_email:
        stripe.Customer.modify(stripe.Customer.create().id, email="not an email")
    with pytest.raises(stripe.InvalidRequestError) as unknown:
        stripe.Customer.modify(customer.id, phone="+1")

    assert (deleted.value.http_status, deleted.value.code) == (404, "resource_missing")
    assert (bad_email.value.http_status, bad_email.value.param) == (400, "email")
    assert (unknown.value.code, unknown.value.param) == ("parameter_unknown", "phone")


# --- charge list ---------------------------------------------------------------------------------


def test_charge_list_pages_newest_first_and_filters_by_customer(sdk: SimulatorServer) -> None:
    made = [
        stripe.Charge.create(amount=100 + i, currency="usd", customer="cus_a" if i % 2 else "cus_b")
        for i in range(5)
    ]
    newest_first = [charge.id for charge in reversed(made)]

    first = stripe.Charge.list(limit=2)
    second = stripe.Charge.list(limit=2, starting_after=first.data[-1].id)
    backwards = stripe.Charge.list(limit=2, ending_before=second.data[0].id)
    everything = [charge.id for charge in stripe.Charge.list(limit=2).auto_paging_iter()]
    of_a = stripe.Charge.list(customer="cus_a")
    of_nobody = stripe.Charge.list(customer="cus_nobody")

    assert (first.object, first.url, first.has_more) == ("list", "/v1/charges", True)
    assert [c.id for c in first.data] + [c.id for c in second.data] == newest_first[:4]
    assert [c.id for c in backwards.data] == newest_first[:2]
    assert everything == newest_first
    assert [c.id for c in of_a.data] == [made[3].id, made[1].id]
    assert (of_nobody.data, of_nobody.has_more) == ([], False)
    assert first.data[0].refunds.url == f"/v1/charges/{first.data[0].id}/refunds"


# --- currencies ----------------------------------------------------------------------------------


def test_an_unknown_currency_is_stripes_invalid_request_with_param_currency(sdk: SimulatorServer) -> None:
    customer = stripe.Customer.create(email="a@example.com")
    before = sdk.stats()

    with pytest.raises(stripe.InvalidRequestError) as on_charge:
        stripe.Charge.create(amount=100, currency="xyz")
    with pytest.raises(stripe.InvalidRequestError) as on_balance:
        stripe.Customer.create_balance_transaction(customer.id, amount=-100, currency="xyz")
    accepted = stripe.Charge.create(amount=100, currency="JPY")

    for caught in (on_charge.value, on_balance.value):
        assert (caught.http_status, caught.param) == (400, "currency")
        assert caught.error is not None and caught.error.type == "invalid_request_error"
        assert caught.user_message is not None
        assert caught.user_message.startswith(
            "Invalid currency: xyz. Stripe currently supports these currencies: usd,"
        )
    assert accepted.currency == "jpy"
    assert sdk.stats()["balance_transactions_created"] == before["balance_transactions_created"]
    assert stripe.Customer.retrieve(customer.id).currency is None


def test_both_gateways_refuse_an_unknown_currency_alike(sim: SimulatorServer, tmp_path: Path) -> None:
    embedded = EmbeddedGateway(str(tmp_path / "embedded.db"))
    for gateway in (embedded, StripeGateway(sim.url, API_KEY)):
        with pytest.raises(ProviderRejectedError, match=r"Invalid currency: xyz\..*\(HTTP 400\)"):
            gateway.create_charge(
                amount=1, currency="xyz", customer="cus_1", metadata={}, idempotency_key="c-xyz"
            )
    embedded.close()


# --- idempotency keys are bound to their first endpoint ------------------------------------------


def test_a_key_reused_on_another_endpoint_is_an_idempotency_error(sdk: SimulatorServer) -> None:
    charge = stripe.Charge.create(amount=100, currency="usd", idempotency_key="shared-key")

    with pytest.raises(stripe.IdempotencyError) as on_refunds:
        stripe.Refund.create(charge=charge.id, idempotency_key="shared-key")
    with pytest.raises(stripe.IdempotencyError) as on_customers:
        stripe.Customer.create(email="a@example.com", idempotency_key="shared-key")
    again = stripe.Charge.create(amount=100, currency="usd", idempotency_key="shared-key")

    for caught in (on_refunds.value, on_customers.value):
        assert caught.http_status == 400
        assert caught.user_message is not None
        assert caught.user_message.startswith(
            "Keys for idempotent requests can only be used for the same endpoint they were first used for"
        )
    assert "('/v1/charges' vs '/v1/refunds')" in str(on_refunds.value.user_message)
    assert again.id == charge.id
    stats = sdk.stats()
    assert (stats["refunds_created"], stats["customers_created"]) == (0, 0)


def test_the_gateway_names_a_key_reused_on_another_endpoint(sim: SimulatorServer, tmp_path: Path) -> None:
    """Its own class (a kind of mismatch, so callers of the mismatch still stop), saying what happened."""
    embedded = EmbeddedGateway(str(tmp_path / "embedded.db"))
    for gateway in (embedded, StripeGateway(sim.url, API_KEY)):
        gateway.create_customer(email="a@example.com", name=None, metadata={}, idempotency_key="k1")
        with pytest.raises(IdempotencyKeyEndpointError, match="first used on another endpoint") as caught:
            gateway.create_charge(
                amount=1, currency="usd", customer="cus_1", metadata={}, idempotency_key="k1"
            )
        assert isinstance(caught.value, IdempotencyKeyMismatchError)
    embedded.close()


# --- live keys -----------------------------------------------------------------------------------


def test_a_live_key_is_stripes_401_and_sees_nothing(sdk: SimulatorServer) -> None:
    stripe.Charge.create(amount=100, currency="usd")

    for call in (
        lambda: stripe.Charge.list(api_key="sk_live_abcdefgh12345678"),
        lambda: stripe.Customer.create(email="a@example.com", api_key="rk_live_abcdefgh12345678"),
    ):
        with pytest.raises(stripe.AuthenticationError) as refused:
            call()
        assert refused.value.http_status == 401
        assert str(refused.value.user_message).startswith("Invalid API Key provided: ")
    assert sdk.stats()["customers_created"] == 0


def test_a_live_key_given_to_the_simulator_is_refused_at_start(tmp_path: Path) -> None:
    with pytest.raises(LiveApiKeyError, match=r"--api-key sk_live_\*+5678 is a live-mode key"):
        build_server(
            "127.0.0.1", 0, str(tmp_path / "live.db"), api_keys=["sk_test_x", "sk_live_abcdefgh12345678"]
        )
    assert not (tmp_path / "live.db").exists()  # refused before the store was made


def test_job_provider_serve_with_a_live_key_exits_2_with_one_line(tmp_path: Path) -> None:
    command = [sys.executable, "-c", "from durable_assets.ops.cli import main; raise SystemExit(main())"]
    args = ["provider", "serve", "--port", "0", "--db", str(tmp_path / "live.db")]
    done = subprocess.run(
        [*command, *args, "--api-key", "rk_live_abcdefgh12345678"],
        capture_output=True,
        text=True,
        timeout=120,
    )

    assert done.returncode == 2, done.stderr
    assert done.stderr.count("\n") == 1 and done.stdout == ""
    assert done.stderr.startswith("error: --api-key rk_live_") and "live-mode key" in done.stderr
