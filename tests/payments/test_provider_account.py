"""Issue #20, provider side: which account a store file is, deleted customers, one balance
transaction, every request counted, and the CLI's check of the configured provider.

The simulator is reached through the official stripe SDK (``StripeGateway``); its restarts are the
real `job provider serve` command, so the account id is shown to live in the ``--db`` file, not in
a process.
"""

from __future__ import annotations

import json
import re
import sqlite3
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import httpx
import pytest
import stripe
from dagster import build_init_resource_context, instance_for_test

from durable_assets.errors import (
    ProviderConfigError,
    ProviderRejectedError,
    ProviderResponseMismatchError,
)
from durable_assets.kit.accounts import ProviderAccount
from durable_assets.payments import resources
from durable_assets.payments.gateway import (
    EmbeddedGateway,
    StripeGateway,
    is_live_key,
    parse_account_id,
)
from durable_assets.payments.resources import PaymentGateway, resolve_provider_account
from durable_assets.payments.store import PaymentStore
from durable_assets_testing.simulator import SimulatorServer
from tests.payments.old_files import old_store_file
from tests.support.network import ServedInThread, free_port
from tests.support.simulator import SimulatorProcess

API_KEY = "sk_test_accounts"
AUTH = {"Authorization": f"Bearer {API_KEY}"}
ACCOUNT_ID = r"acct_[A-Za-z0-9]{16}"


@pytest.fixture(params=["embedded", "stripe"])
def gateway(request: pytest.FixtureRequest, tmp_path: Path) -> EmbeddedGateway | StripeGateway:
    if request.param == "embedded":
        embedded = EmbeddedGateway(str(tmp_path / "embedded.db"))
        request.addfinalizer(embedded.close)
        return embedded
    sim: SimulatorServer = request.getfixturevalue("sim")
    return StripeGateway(sim.url, API_KEY, timeout_s=10)


def _customer_with_credit(gateway: EmbeddedGateway | StripeGateway, key: str) -> tuple[str, str]:
    customer = gateway.create_customer(
        email=None, name=None, metadata={"legacy_account_id": key}, idempotency_key=key
    )
    move = gateway.create_balance_transaction(
        customer_id=customer.id,
        amount=-500,
        currency="usd",
        description=None,
        metadata={},
        idempotency_key=f"{key}-credit",
    )
    return customer.id, move.id


# --- the account -----------------------------------------------------------------------------------


def test_the_simulators_account_lives_in_its_db_file(tmp_path: Path) -> None:
    """Same --db across a restart: the same account; another --db: another account."""
    ids = []
    for db in ("a.db", "a.db", "b.db"):
        with SimulatorProcess(tmp_path / db) as sim:
            ids.append(StripeGateway(sim.url, API_KEY).account())
    assert ids[0] == ids[1]
    assert ids[0].account != ids[2].account
    for account in ids:
        assert account.kind == "stripe" and not account.livemode
        assert re.fullmatch(ACCOUNT_ID, account.account), account


def test_the_account_object_reads_through_the_sdk(sim: SimulatorServer) -> None:
    client = stripe.StripeClient(API_KEY, base_addresses={"api": sim.url}, max_network_retries=0)
    account = client.v1.accounts.retrieve_current()
    assert account.id == sim.store.account_id and account.object == "account"
    assert (account.charges_enabled, account.payouts_enabled, account.details_submitted) == (True, True, True)
    assert (account.country, account.default_currency, account.type, account.email) == (
        "US",
        "usd",
        "standard",
        None,
    )


def test_the_embedded_account_is_stable_across_reopens(tmp_path: Path) -> None:
    path = str(tmp_path / "payments.db")
    first = EmbeddedGateway(path)
    try:
        account = first.account()
    finally:
        first.close()
    again = EmbeddedGateway(path)
    try:
        assert again.account() == account
    finally:
        again.close()
    other = EmbeddedGateway(str(tmp_path / "other.db"))
    try:
        assert other.account() != account
    finally:
        other.close()
    assert account.kind == "embedded" and account.livemode is False
    assert re.fullmatch(ACCOUNT_ID, account.account)


_OPEN_AND_PRINT = (
    "import sys; from durable_assets.payments.store import PaymentStore\n"
    "s = PaymentStore(sys.argv[1]); print(s.account_id); s.close()"
)


def test_an_old_file_gets_one_account_even_when_two_processes_open_it_at_once(tmp_path: Path) -> None:
    path = tmp_path / "old.db"
    old_store_file(path, 2)
    openers = [
        subprocess.Popen(
            [sys.executable, "-c", _OPEN_AND_PRINT, str(path)], stdout=subprocess.PIPE, text=True
        )
        for _ in range(2)
    ]
    printed = [opener.communicate(timeout=60)[0].strip() for opener in openers]
    assert [opener.returncode for opener in openers] == [0, 0]
    with PaymentStore(str(path)) as store:
        assert printed == [store.account_id, store.account_id]
        assert store.retrieve_customer("cus_old")["id"] == "cus_old"  # the upgrade kept what was there
        assert store.list_customers()["data"][0]["id"] == "cus_old"
    assert sqlite3.connect(path).execute("SELECT count(*) FROM account").fetchone() == (1,)


def test_livemode_is_the_keys() -> None:
    assert [
        is_live_key(k) for k in ("sk_live_x", "rk_live_x", "sk_test_x", "rk_test_x", "pk_live_x", "x")
    ] == [
        True,
        True,
        False,
        False,
        False,
        False,
    ]


class _LiveStripe(BaseHTTPRequestHandler):
    """Stripe in live mode, as far as ``GET /v1/account`` goes: the simulator refuses live keys
    (issue #34: its objects are all test mode), so the live side is this stand-in."""

    ACCOUNT = "acct_LiveStandIn00001"

    def do_GET(self) -> None:
        body = json.dumps({"id": self.ACCOUNT, "object": "account"}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:
        """Quiet."""


def test_a_live_key_makes_a_live_account() -> None:
    with ServedInThread(ThreadingHTTPServer(("127.0.0.1", 0), _LiveStripe)) as live:
        for key in ("sk_live_real", "rk_live_real"):
            assert StripeGateway(f"http://127.0.0.1:{live.port}", key).account() == ProviderAccount(
                "stripe", _LiveStripe.ACCOUNT, True
            )


@pytest.mark.parametrize(
    "body",
    [
        {"object": "account"},
        {"object": "account", "id": 7},
        {"object": "account", "id": "cus_1"},
        {"object": "account", "id": "acct_"},
        {"object": "customer", "id": "acct_1"},
        None,
    ],
)
def test_an_account_answer_without_an_acct_id_fails_closed(body: object) -> None:
    with pytest.raises(ProviderResponseMismatchError):
        parse_account_id(body)


# --- deleted customers, one balance transaction ------------------------------------------------------


def test_a_deleted_customer_answers_deleted_and_refuses_writes(
    gateway: EmbeddedGateway | StripeGateway,
) -> None:
    customer_id, _ = _customer_with_credit(gateway, "L1")
    kept_id, _ = _customer_with_credit(gateway, "L2")

    deleted = gateway.delete_customer(customer_id)

    assert deleted.deleted and deleted.id == customer_id
    assert (deleted.email, deleted.name, deleted.balance, deleted.currency, deleted.metadata) == (
        None,
        None,
        0,
        None,
        {},
    )
    assert gateway.retrieve_customer(customer_id) == deleted
    assert [c.id for c in gateway.list_customers()] == [kept_id]
    assert gateway.find_customer(metadata_key="legacy_account_id", value="L1") is None
    with pytest.raises(ProviderRejectedError) as write:
        gateway.create_balance_transaction(
            customer_id=customer_id,
            amount=-1,
            currency="usd",
            description=None,
            metadata={},
            idempotency_key="k",
        )
    assert (write.value.http_status, write.value.code) == (404, "resource_missing")
    with pytest.raises(ProviderRejectedError) as again:
        gateway.delete_customer(customer_id)
    assert (again.value.http_status, again.value.code) == (404, "resource_missing")
    with pytest.raises(ProviderRejectedError) as unknown:
        gateway.retrieve_customer("cus_unknown")
    assert unknown.value.http_status == 404
    assert gateway.stats()["customers_deleted"] == 1


def test_one_balance_transaction_and_only_of_its_customer(gateway: EmbeddedGateway | StripeGateway) -> None:
    customer_id, move_id = _customer_with_credit(gateway, "L1")
    other_id, _ = _customer_with_credit(gateway, "L2")

    move = gateway.retrieve_balance_transaction(customer_id, move_id)

    assert (move.id, move.customer_id, move.amount, move.ending_balance) == (move_id, customer_id, -500, -500)
    assert move == gateway.list_balance_transactions(customer_id)[0]
    with pytest.raises(ProviderRejectedError) as other:
        gateway.retrieve_balance_transaction(other_id, move_id)
    assert (other.value.http_status, other.value.code) == (404, "resource_missing")


# --- the HTTP front: requests, Authorization, faults -------------------------------------------------


def test_requests_counts_every_v1_request_whatever_its_answer(sim: SimulatorServer) -> None:
    with httpx.Client(base_url=sim.url, timeout=10) as http:
        before = http.get("/_sim/stats").json()["requests"]
        answers = [
            http.get("/v1/account", headers=AUTH).status_code,
            http.get("/v1/account").status_code,  # no key
            http.get("/v1/account", headers={"Authorization": "Bearer sk_test_"}).status_code,  # refused key
            http.get("/v1/nothing-here", headers=AUTH).status_code,
            http.delete("/v1/customers/cus_missing", headers=AUTH).status_code,
            http.get("/v1/customers/cus_1/balance_transactions/cbtxn_1", headers=AUTH).status_code,
            http.post("/v1/customers", data={"color": "red"}, headers=AUTH).status_code,
        ]
        sim.configure(error_rate=1.0)
        answers.append(http.get("/v1/account", headers=AUTH).status_code)
        sim.configure(error_rate=0.0, rate_limit=0.5)
        answers += [http.get("/v1/account", headers=AUTH).status_code for _ in range(2)]
        sim.configure(rate_limit=None)
        http.get("/healthz")  # not an API request
        after = http.get("/_sim/stats").json()["requests"]
    assert answers == [200, 401, 401, 404, 404, 404, 400, 500, 200, 429]
    assert after - before == len(answers)


def test_two_authorization_headers_are_a_400(sim: SimulatorServer) -> None:
    both = [("Authorization", f"Bearer {API_KEY}"), ("Authorization", f"Bearer {API_KEY}")]
    response = httpx.get(f"{sim.url}/v1/account", headers=both, timeout=10)
    assert response.status_code == 400
    error = response.json()["error"]
    assert error["type"] == "invalid_request_error" and "Authorization" in error["message"]


def test_faults_apply_to_the_new_routes(sim: SimulatorServer) -> None:
    gateway = StripeGateway(sim.url, API_KEY, timeout_s=10)
    customer_id, move_id = _customer_with_credit(gateway, "L1")
    with httpx.Client(base_url=sim.url, timeout=10, headers=AUTH) as http:
        sim.configure(error_rate=1.0)
        assert http.get("/v1/account").status_code == 500
        assert http.get(f"/v1/customers/{customer_id}/balance_transactions/{move_id}").status_code == 500
        assert http.delete(f"/v1/customers/{customer_id}").status_code == 500
        sim.configure(error_rate=0.0, rate_limit=0.5)
        http.get("/v1/account")  # takes the one token of the burst
        assert http.delete(f"/v1/customers/{customer_id}").status_code == 429
        sim.configure(rate_limit=None, lost_response_rate=1.0)
        with pytest.raises(httpx.TransportError):
            http.delete(f"/v1/customers/{customer_id}")
        sim.configure(lost_response_rate=0.0)
    assert gateway.retrieve_customer(customer_id).deleted  # the lost delete was committed
    assert gateway.stats()["customers_deleted"] == 1


# --- the resource and the CLI's check -----------------------------------------------------------------


def test_the_resource_asks_for_the_account_once(sim: SimulatorServer) -> None:
    with instance_for_test() as instance:
        resource = PaymentGateway(payments_url=sim.url, api_key=API_KEY)
        resource.setup_for_execution(build_init_resource_context(instance=instance))
        before = sim.stats()["requests"]
        accounts = [resource.account, resource.account]
    assert accounts == [ProviderAccount("stripe", sim.store.account_id, False)] * 2
    assert sim.stats()["requests"] - before == 1


def test_a_run_reuses_the_account_its_thread_just_checked(
    sim: SimulatorServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`job run` checks the provider, then runs the batch in the same thread: the run's first step
    takes that answer instead of asking again. Another key, another thread, or an old answer asks."""

    def asked(resource: PaymentGateway) -> int:
        with instance_for_test() as instance:
            resource.setup_for_execution(build_init_resource_context(instance=instance))
            before = sim.stats()["requests"]
            assert resource.account == ProviderAccount("stripe", sim.store.account_id, False)
            return sim.stats()["requests"] - before

    checked = resolve_provider_account(sim.url, API_KEY, tmp_path)
    assert checked == ProviderAccount("stripe", sim.store.account_id, False)
    assert asked(PaymentGateway(payments_url=sim.url, api_key=API_KEY)) == 0
    assert asked(PaymentGateway(payments_url=sim.url, api_key="sk_test_other")) == 1
    in_another_thread: list[int] = []
    thread = threading.Thread(
        target=lambda: in_another_thread.append(asked(PaymentGateway(payments_url=sim.url, api_key=API_KEY)))
    )
    thread.start()
    thread.join()
    assert in_another_thread == [1]
    monkeypatch.setattr(resources, "ACCOUNT_ANSWER_REUSE_S", 0.0)  # the check is older than that
    assert asked(PaymentGateway(payments_url=sim.url, api_key=API_KEY)) == 1


def test_resolve_names_each_configured_provider(sim: SimulatorServer, tmp_path: Path) -> None:
    embedded = resolve_provider_account(None, None, tmp_path)
    with PaymentStore(str(tmp_path / "payments.db")) as store:
        assert embedded == ProviderAccount("embedded", store.account_id, False)
    assert resolve_provider_account(sim.url, API_KEY, tmp_path) == ProviderAccount(
        "stripe", sim.store.account_id, False
    )


def test_resolve_retries_transient_faults(sim: SimulatorServer, tmp_path: Path) -> None:
    sim.configure(error_rate=0.5)  # seed 7 draws 0.32, 0.15, 0.65: two 500s, then the answer
    before = sim.stats()["requests"]
    account = resolve_provider_account(sim.url, API_KEY, tmp_path)
    assert account.account == sim.store.account_id
    assert sim.stats()["requests"] - before == 3


def test_resolve_without_a_key_is_a_config_error(tmp_path: Path) -> None:
    with pytest.raises(ProviderConfigError, match="DURABLE_PAYMENTS_URL is set but STRIPE_API_KEY is not"):
        resolve_provider_account("http://127.0.0.1:1", None, tmp_path)


def test_resolve_with_a_refused_key_is_a_config_error(sim: SimulatorServer, tmp_path: Path) -> None:
    with pytest.raises(ProviderConfigError) as refused:
        resolve_provider_account(sim.url, "sk_live_wrong", tmp_path)
    message = str(refused.value)
    assert "refused STRIPE_API_KEY (HTTP 401)" in message and sim.url in message and "\n" not in message
    assert refused.value.exit_code == 2


def test_resolve_of_an_unreachable_provider_is_a_config_error(tmp_path: Path) -> None:
    url = f"http://127.0.0.1:{free_port()}"
    with pytest.raises(ProviderConfigError) as unreachable:
        resolve_provider_account(url, API_KEY, tmp_path, budget_s=1.0)
    message = str(unreachable.value)
    assert (
        f"DURABLE_PAYMENTS_URL={url}" in message and "gave no usable answer for 1 s (no answer" in message
    ), message
    assert "\n" not in message
