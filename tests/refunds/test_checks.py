"""Asset checks that guard money: pass on a clean batch, fail (and block notices) when money is off."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pandas as pd
from dagster import AssetCheckSeverity, AssetSelection, DagsterInstance, materialize

from durable_assets.definitions import defs
from durable_assets.kit.tags import BATCH_TAG
from durable_assets.payments.store import PaymentStore
from durable_assets.refunds.assets import ALL_ASSETS, BATCHES, issued_refunds
from durable_assets.refunds.checks import (
    ALL_CHECKS,
    refunds_match_candidates,
    refunds_within_batch_ceiling,
)
from durable_assets.refunds.resources import RefundLimits


def _run(instance: DagsterInstance, batch: str, selection: Any = None, **resources: Any) -> Any:
    instance.add_dynamic_partitions(BATCHES.name or "batches", [batch])
    return materialize(
        [*ALL_ASSETS, *ALL_CHECKS],
        selection=selection,
        instance=instance,
        partition_key=batch,
        resources={**defs.resources, **resources},
        run_config={"ops": {"invoices": {"config": {"size": 200}}}} if selection is None else None,
        tags={BATCH_TAG: batch},
        raise_on_error=False,
    )


def _evaluations(result: Any) -> dict[str, Any]:
    return {e.check_name: e for e in result.get_asset_check_evaluations()}


def test_clean_batch_passes_every_check_with_the_money_in_metadata(dagster_home: Path) -> None:
    with DagsterInstance.get() as instance:
        result = _run(instance, "clean")
        assert result.success
        evals = _evaluations(result)
        assert set(evals) == {spec.name for c in ALL_CHECKS for spec in c.check_specs}
        assert all(e.passed for e in evals.values()), {n: e.metadata for n, e in evals.items()}
        match = evals["refunds_match_candidates"].metadata
        assert match["approved"].value == match["refunded"].value > 0
        assert match["approved_cents"].value == match["refunded_cents"].value
        assert evals["no_duplicate_refunds_at_provider"].metadata["refunds_checked"].value > 0


def _paid_again_behind_our_back(
    instance: DagsterInstance, dagster_home: Path, batch: str, metadata: Callable[[pd.Series], dict[str, str]]
) -> Any:
    """Run the batch; then someone else refunds one of its overcharges once more at the provider,
    with ``metadata(row)``; then the steps from the refunds on run again (their checks included)."""
    assert _run(instance, batch).success
    issued = pd.read_pickle(dagster_home / "storage" / "issued_refunds" / batch)
    row = issued.query("reason == 'overcharge'").iloc[0]
    with PaymentStore(str(dagster_home / "payments.db")) as store:
        store.create_refund(charge=row["charge_id"], amount=1, metadata=metadata(row))
    return _run(instance, batch, selection=AssetSelection.assets(issued_refunds).downstream())


def test_a_second_refund_under_one_key_at_the_provider_fails_and_blocks_notices(dagster_home: Path) -> None:
    with DagsterInstance.get() as instance:
        # Someone else paid out under our key (e.g. a provider that forgot the key): money paid twice.
        again = _paid_again_behind_our_back(
            instance, dagster_home, "dup", lambda row: {"idempotency_key": row["idempotency_key"]}
        )
        assert not again.success
        dup = _evaluations(again)["no_duplicate_refunds_at_provider"]
        assert not dup.passed and dup.severity == AssetCheckSeverity.ERROR
        assert dup.metadata["provider_problems"].value == 1
        materialized = {m.asset_key.path[-1] for m in again.get_asset_materialization_events()}
        assert materialized == {"issued_refunds"}  # reconciliation and notices were blocked


def test_a_second_refund_of_one_charge_for_one_reason_fails_the_check(dagster_home: Path) -> None:
    """Issue #14.3: another key (another invoice, an earlier system) refunding the charge again."""
    with DagsterInstance.get() as instance:
        again = _paid_again_behind_our_back(
            instance,
            dagster_home,
            "twice",
            lambda _row: {"idempotency_key": "refund-from-elsewhere", "durable_reason": "overcharge"},
        )
        assert not again.success
        dup = _evaluations(again)["no_duplicate_refunds_at_provider"]
        assert not dup.passed and dup.metadata["provider_problems"].value == 1
        assert "refunds for overcharge" in str(dup.metadata["examples"].value)


def _frames() -> tuple[pd.DataFrame, pd.DataFrame]:
    candidates = pd.DataFrame(
        {"invoice_id": ["A", "B", "C"], "refund_cents": [100, 200, 300], "currency": ["usd"] * 3}
    )
    issued = pd.DataFrame(
        {
            "invoice_id": ["A", "B", "C"],
            "amount_cents": [100, 200, 300],
            "currency": ["usd"] * 3,
            "status": ["refunded"] * 3,
        }
    )
    return candidates, issued


def test_match_check_errors_on_a_missing_or_changed_refund_and_warns_on_review() -> None:
    candidates, issued = _frames()
    ok = refunds_match_candidates(issued_refunds=issued, refund_candidates=candidates)
    assert ok.passed

    missing = refunds_match_candidates(issued_refunds=issued.iloc[:2], refund_candidates=candidates)
    assert not missing.passed and missing.severity == AssetCheckSeverity.ERROR
    assert missing.metadata["missing"].value == 1

    changed = issued.assign(amount_cents=[100, 201, 300])
    wrong = refunds_match_candidates(issued_refunds=changed, refund_candidates=candidates)
    assert not wrong.passed and wrong.metadata["wrong_amount_or_currency"].value == 1

    held = issued.assign(status=["refunded", "held_for_review", "refunded"])
    review = refunds_match_candidates(issued_refunds=held, refund_candidates=candidates)
    assert not review.passed and review.severity == AssetCheckSeverity.WARN
    assert review.metadata["held_for_review"].value == 1


def test_refunds_above_the_ceiling_fail_the_ceiling_check() -> None:
    _, issued = _frames()
    within = refunds_within_batch_ceiling(issued_refunds=issued, limits=RefundLimits())
    assert within.passed
    over = refunds_within_batch_ceiling(
        issued_refunds=issued, limits=RefundLimits(max_amount_per_batch_cents=599)
    )
    assert not over.passed and over.severity == AssetCheckSeverity.ERROR
    assert over.metadata["currencies_over_ceiling"].value == {"usd": 600}
    count = refunds_within_batch_ceiling(issued_refunds=issued, limits=RefundLimits(max_refunds_per_batch=2))
    assert not count.passed


def test_every_money_check_on_issued_refunds_blocks_downstream() -> None:
    blocking = {spec.name for c in ALL_CHECKS for spec in c.check_specs if spec.blocking}
    assert blocking == {
        "refunds_match_candidates",
        "refunds_within_batch_ceiling",
        "no_duplicate_refunds_at_provider",
    }
    assert {spec.asset_key.path[-1] for c in ALL_CHECKS for spec in c.check_specs if spec.blocking} == {
        "issued_refunds"
    }
