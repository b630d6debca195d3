"""Reconciliation reads each refunded charge once, and that one read serves the duplicate check too.

Issue #25, bench 3: the duplicate check listed every refunded charge's refunds and reconciliation
then retrieved every refund — two provider reads per refund after the refunds. The requests are
counted where the worker cannot miscount them: at the simulator, by route, as they arrive.
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pandas as pd
import pytest
from dagster import DagsterInstance

from durable_assets.payments.gateway import IDEMPOTENCY_KEY_METADATA, Refund
from durable_assets.payments.resources import PaymentGateway
from durable_assets.refunds.assets import _read_back
from durable_assets.refunds.notices import Mailbox
from durable_assets_testing.simulator import SimulatorHandler
from tests.support.refund_runs import AFTER_REFUNDS, UP_TO_REFUNDS, materialized, run_refunds
from tests.support.simulator import ThreadedSimulator

API_KEY = "sk_test_reconciliation"


class Provider:
    """The simulator, with every ``/v1`` request counted by route (``GET /v1/refunds?charge=C`` is
    one charge's listing) and, when :attr:`tamper` is set, each listing's answer passed through it."""

    def __init__(self, served: ThreadedSimulator) -> None:
        self.url = served.url
        self.requests: Counter[str] = Counter()
        self.tamper: Any = None
        lock = threading.Lock()
        provider = self

        class Counting(SimulatorHandler):
            def _handle_api(self, path: str, encoded_params: str) -> None:
                route = f"{self.command} {path}"
                if path.startswith("/v1/refunds/"):
                    route = f"{self.command} /v1/refunds/{{id}}"
                elif path == "/v1/refunds" and self.command == "GET":
                    charge = dict(p.partition("=")[::2] for p in encoded_params.split("&")).get("charge")
                    route = f"GET /v1/refunds?charge={charge}"
                with lock:
                    provider.requests[route] += 1
                super()._handle_api(path, encoded_params)

            def _send(self, response: Any) -> None:
                listing = self.command == "GET" and self.path.startswith("/v1/refunds?")
                if listing and provider.tamper is not None and response.status == 200:
                    provider.tamper(response.body)
                super()._send(response)

        served.server.RequestHandlerClass = Counting  # before the first request: read per connection

    def gateway(self) -> PaymentGateway:
        return PaymentGateway(payments_url=self.url, api_key=API_KEY)


@pytest.fixture
def provider(tmp_path: Path) -> Iterator[Provider]:
    with ThreadedSimulator(tmp_path / "sim.db", seed=5) as served:
        yield Provider(served)


def _refunded(dagster_home: Path, batch: str) -> pd.DataFrame:
    issued = pd.read_pickle(dagster_home / "storage" / "issued_refunds" / batch)
    return issued[issued["status"] == "refunded"]


def test_after_the_refunds_the_provider_is_read_once_per_refunded_charge(
    dagster_home: Path, provider: Provider
) -> None:
    with DagsterInstance.get() as instance:
        assert run_refunds(instance, "reads", UP_TO_REFUNDS, size=60, payments=provider.gateway()).success
        refunded = _refunded(dagster_home, "reads")
        assert len(refunded) > 0 and provider.requests["POST /v1/refunds"] == len(refunded)

        provider.requests.clear()
        rest = run_refunds(instance, "reads", AFTER_REFUNDS, size=None, payments=provider.gateway())
        assert rest.success
        assert {"reconciled_refunds", "customer_notices", "batch_report"} <= materialized(rest)
        # Reconciliation and the duplicate check together: one listing per refunded charge, nothing
        # else (no refund retrieved by id, no second listing of any charge).
        assert dict(provider.requests) == {f"GET /v1/refunds?charge={c}": 1 for c in refunded["charge_id"]}
        evaluations = {e.check_name: e for e in rest.get_asset_check_evaluations()}
        assert evaluations["no_duplicate_refunds_at_provider"].passed
        assert evaluations["no_duplicate_refunds_at_provider"].metadata["refunds_checked"].value == len(
            refunded
        )
        reconciled = pd.read_pickle(dagster_home / "storage" / "reconciled_refunds" / "reads")
        mine = reconciled[reconciled["status"] == "refunded"]
        assert set(mine["reconciliation"]) == {"matched"}
        assert (mine["provider_ids_with_key"] == mine["provider_id"]).all()
        assert set(mine["provider_refunds_with_key"]) == set(mine["provider_refunds_for_reason"]) == {1}
        assert Mailbox(dagster_home / "mailbox.db").count() == len(refunded)


def test_a_listing_with_another_charges_refund_fails_closed_and_no_notice_is_sent(
    dagster_home: Path, provider: Provider
) -> None:
    with DagsterInstance.get() as instance:
        assert run_refunds(instance, "lies", UP_TO_REFUNDS, size=60, payments=provider.gateway()).success

        def another_charges(body: dict[str, Any]) -> None:
            if body["data"]:
                body["data"][0]["charge"] = "ch_someone_else"

        provider.tamper = another_charges
        rest = run_refunds(instance, "lies", AFTER_REFUNDS, size=None, payments=provider.gateway())
        assert not rest.success
        assert materialized(rest) == set()
        failure = next(e for e in rest.all_events if e.is_step_failure and e.step_key == "reconciled_refunds")
        assert "ch_someone_else" in str(failure.event_specific_data)
        assert Mailbox(dagster_home / "mailbox.db").count() == 0


def _refund(refund_id: str, **changes: Any) -> Refund:
    fields: dict[str, Any] = {
        "id": refund_id,
        "amount": 200,
        "currency": "usd",
        "charge_id": "ch_1",
        "status": "succeeded",
        "reason": "requested_by_customer",
        "metadata": {IDEMPOTENCY_KEY_METADATA: "k-1", "durable_reason": "overcharge"},
    }
    return Refund(**{**fields, **changes})


ROW = {
    "provider_id": "re_1",
    "idempotency_key": "k-1",
    "amount_cents": 200,
    "currency": "usd",
    "reason": "overcharge",
}


def test_our_refund_is_reconciled_from_its_charges_listing() -> None:
    assert _read_back(ROW, [_refund("re_1")]) == {
        "reconciliation": "matched",
        "provider_refunds_with_key": 1,
        "provider_ids_with_key": "re_1",
        "provider_refunds_for_reason": 1,
        "provider_ids_for_reason": "re_1",
    }
    assert _read_back(ROW, [_refund("re_1", status="pending")])["reconciliation"] == "matched"
    # Differs from our record, or absent from the listing: a mismatch, never trusted.
    for listing in (
        [_refund("re_1", amount=201)],
        [_refund("re_1", currency="eur")],
        [_refund("re_1", status="failed")],
        [_refund("re_2")],
        [],
    ):
        assert _read_back(ROW, listing)["reconciliation"] == "mismatch", listing
    # The others with our key or reason are counted for the duplicate check, not judged here.
    crowded = _read_back(
        ROW, [_refund("re_1"), _refund("re_2"), _refund("re_3", metadata={"durable_reason": "overcharge"})]
    )
    assert crowded["reconciliation"] == "matched"
    assert (crowded["provider_refunds_with_key"], crowded["provider_ids_with_key"]) == (2, "re_1, re_2")
    assert (crowded["provider_refunds_for_reason"], crowded["provider_ids_for_reason"]) == (
        3,
        "re_1, re_2, re_3",
    )
