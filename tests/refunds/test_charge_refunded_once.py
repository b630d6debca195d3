"""Issue #14.3: the charge is what is refunded — at most once per reason, whatever rows or batches say."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pandas as pd
from dagster import DagsterInstance, materialize

from durable_assets.definitions import defs
from durable_assets.kit.tags import BATCH_TAG
from durable_assets.payments.store import PaymentStore
from durable_assets.refunds.assets import ALL_ASSETS, BATCHES
from durable_assets.refunds.checks import ALL_CHECKS

HEADER = (
    "invoice_id,customer_id,customer_email,charge_id,currency,amount_charged,contracted_amount,"
    "already_refunded,service_period,charged_at,cancelled_at"
)


def _row(invoice: str, customer: str, charge: str) -> str:
    # Charged 12.00 against a 10.00 contract: a 2.00 overcharge refund.
    email = f"{customer.lower()}@example.com"
    return f"{invoice},{customer},{email},{charge},usd,12.00,10.00,0,2026-10,2026-10-01T00:00:00Z,"


def _batch(instance: DagsterInstance, home: Path, batch: str, rows: list[str]) -> Any:
    path = home / f"{batch}.csv"
    path.write_text("\n".join([HEADER, *rows]) + "\n")
    instance.add_dynamic_partitions(BATCHES.name or "batches", [batch])
    result = materialize(
        [*ALL_ASSETS, *ALL_CHECKS],
        instance=instance,
        partition_key=batch,
        resources=defs.resources,
        run_config={"ops": {"invoices": {"config": {"path": str(path)}}}},
        tags={BATCH_TAG: batch},
        raise_on_error=False,
    )
    assert result.success, [str(e.step_failure_data.error) for e in result.all_events if e.is_step_failure]
    checks = {e.check_name: e for e in result.get_asset_check_evaluations()}
    assert all(e.passed for e in checks.values() if e.check_name != "refunds_match_candidates"), checks
    return result


def _refunds_of(store: PaymentStore, charge: str) -> list[dict[str, Any]]:
    return list(store.list_refunds(charge=charge, limit=100)["data"])


def test_rows_and_batches_naming_one_charge_refund_it_once(dagster_home: Path) -> None:
    store = PaymentStore(str(dagster_home / "payments.db"))
    shared = store.create_charge(amount=1200, currency="usd", customer="C1").body["id"]
    single = store.create_charge(amount=1200, currency="usd", customer="C4").body["id"]
    with DagsterInstance.get() as instance:
        # Three invoice rows on one charge: ambiguous, so all three are quarantined, none refunded.
        _batch(
            instance,
            dagster_home,
            "night-1",
            [
                _row("INV-1", "C1", shared),
                _row("INV-2", "C2", shared),
                _row("INV-3", "C3", shared),
                _row("INV-4", "C4", single),
            ],
        )
        quarantine = pd.read_csv(dagster_home / "batches" / "night-1" / "quarantine.csv")
        assert sorted(quarantine["invoice_id"]) == ["INV-1", "INV-2", "INV-3"]
        assert quarantine["reasons"].str.contains("shared_charge_id").all()
        assert _refunds_of(store, shared) == []
        assert len(_refunds_of(store, single)) == 1

        # A later batch names the refunded charge through another invoice, for the same reason:
        # held for review with a note saying why, and no second refund at the provider.
        _batch(instance, dagster_home, "night-2", [_row("INV-9", "C4", single)])
        issued = pd.read_pickle(dagster_home / "storage" / "issued_refunds" / "night-2")
        [held] = issued.to_dict("records")
        assert held["status"] == "held_for_review"
        assert (
            f"charge {single} was already refunded for overcharge through invoice INV-4"
            in held["review_note"]
        )
        assert len(_refunds_of(store, single)) == 1
        # The report accounts for the provider's refund of that charge and reason, both ways.
        reconciled = pd.read_pickle(dagster_home / "storage" / "reconciled_refunds" / "night-2")
        [read] = reconciled.to_dict("records")
        assert read["reconciliation"] == "refunded_at_provider"
        assert read["provider_ids_for_reason"] == _refunds_of(store, single)[0]["id"]

        # The same invoice again in a third batch is the same refund: replayed, not repeated.
        _batch(instance, dagster_home, "night-3", [_row("INV-4", "C4", single)])
        again = pd.read_pickle(dagster_home / "storage" / "issued_refunds" / "night-3")
        assert list(again["status"]) == ["refunded"]
    assert len(_refunds_of(store, single)) == 1
    assert store.stats()["refunds_created"] == 1
