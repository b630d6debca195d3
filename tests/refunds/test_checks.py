"""Asset checks that guard money: pass on a clean batch, fail (and block notices) when money is off."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pandas as pd
from dagster import AssetCheckSeverity, DagsterInstance

from durable_assets.payments.store import PaymentStore
from durable_assets.refunds import schema as s
from durable_assets.refunds.checks import (
    ALL_CHECKS,
    no_duplicate_refunds_at_provider,
    refunds_match_candidates,
    refunds_within_batch_ceiling,
)
from durable_assets.refunds.notices import Mailbox
from durable_assets.refunds.resources import RefundLimits
from tests.support.refund_runs import AFTER_REFUNDS, UP_TO_REFUNDS, materialized, run_refunds


def _evaluations(result: Any) -> dict[str, Any]:
    return {e.check_name: e for e in result.get_asset_check_evaluations()}


def test_clean_batch_passes_every_check_with_the_money_in_metadata(dagster_home: Path) -> None:
    with DagsterInstance.get() as instance:
        result = run_refunds(instance, "clean")
        assert result.success
        evals = _evaluations(result)
        assert set(evals) == {spec.name for c in ALL_CHECKS for spec in c.check_specs}
        assert all(e.passed for e in evals.values()), {n: e.metadata for n, e in evals.items()}
        match = evals["refunds_match_candidates"].metadata
        assert match["approved"].value == match["refunded"].value > 0
        assert match["approved_cents"].value == match["refunded_cents"].value
        assert evals["no_duplicate_refunds_at_provider"].metadata["refunds_checked"].value > 0
        assert Mailbox(dagster_home / "mailbox.db").count() == match["refunded"].value


def _paid_again_behind_our_back(
    instance: DagsterInstance, dagster_home: Path, batch: str, metadata: Callable[[pd.Series], dict[str, str]]
) -> Any:
    """Run the batch up to its refunds; then someone else refunds one of its overcharges once more
    at the provider, with ``metadata(row)``; then the rest of the batch runs (checks included)."""
    assert run_refunds(instance, batch, UP_TO_REFUNDS).success
    issued = pd.read_pickle(dagster_home / "storage" / "issued_refunds" / batch)
    row = issued.query("reason == 'overcharge'").iloc[0]
    with PaymentStore(str(dagster_home / "payments.db")) as store:
        store.create_refund(charge=row["charge_id"], amount=1, metadata=metadata(row))
    return run_refunds(instance, batch, AFTER_REFUNDS, size=None)


def _assert_blocked_before_any_notice(again: Any, dagster_home: Path) -> None:
    """Reconciliation (read-only) ran and its duplicate check stopped the batch there: no customer
    was told about a refund paid twice, and no report claims the batch is done."""
    assert not again.success
    assert materialized(again) == {"reconciled_refunds"}
    assert Mailbox(dagster_home / "mailbox.db").count() == 0


def test_a_second_refund_under_one_key_at_the_provider_fails_and_blocks_notices(dagster_home: Path) -> None:
    with DagsterInstance.get() as instance:
        # Someone else paid out under our key (e.g. a provider that forgot the key): money paid twice.
        again = _paid_again_behind_our_back(
            instance, dagster_home, "dup", lambda row: {"idempotency_key": row["idempotency_key"]}
        )
        dup = _evaluations(again)["no_duplicate_refunds_at_provider"]
        assert not dup.passed and dup.severity == AssetCheckSeverity.ERROR
        assert dup.metadata["provider_problems"].value == 1
        assert "2 refunds with this key at the provider" in str(dup.metadata["examples"].value)
        _assert_blocked_before_any_notice(again, dagster_home)


def test_a_second_refund_of_one_charge_for_one_reason_fails_the_check(dagster_home: Path) -> None:
    """Issue #14.3: another key (another invoice, an earlier system) refunding the charge again."""
    with DagsterInstance.get() as instance:
        again = _paid_again_behind_our_back(
            instance,
            dagster_home,
            "twice",
            lambda _row: {"idempotency_key": "refund-from-elsewhere", "durable_reason": "overcharge"},
        )
        dup = _evaluations(again)["no_duplicate_refunds_at_provider"]
        assert not dup.passed and dup.metadata["provider_problems"].value == 1
        assert "2 refunds for overcharge" in str(dup.metadata["examples"].value)
        _assert_blocked_before_any_notice(again, dagster_home)


def _reconciled(**changes: list[Any]) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Two refunded invoices and one held for review, as reconciliation stores them after a clean
    listing of each charge, with ``changes`` applied; and the candidates they came from."""
    rows = pd.DataFrame(
        {
            s.INVOICE_ID: ["A", "B", "C"],
            s.CHARGE_ID: ["ch_a", "ch_b", "ch_c"],
            "idempotency_key": ["k-a", "k-b", "k-c"],
            "provider_id": ["re_a", "re_b", ""],
            "amount_cents": [100, 200, 300],
            s.CURRENCY: ["usd"] * 3,
            "reason": ["overcharge"] * 3,
            "status": ["refunded", "refunded", "held_for_review"],
            "review_note": ["", "", "a person looks"],
            "reconciliation": ["matched", "matched", "not_refunded"],
            "provider_refunds_with_key": [1, 1, 0],
            "provider_ids_with_key": ["re_a", "re_b", ""],
            "provider_refunds_for_reason": [1, 1, 0],
            "provider_ids_for_reason": ["re_a", "re_b", ""],
        }
    ).assign(**changes)
    candidates = rows[[s.INVOICE_ID, s.CHARGE_ID]]
    return rows, candidates


def _provider_problems(**changes: list[Any]) -> list[str]:
    rows, candidates = _reconciled(**changes)
    # The check's only inputs are the two stored frames: it has no provider to call.
    result = no_duplicate_refunds_at_provider(reconciled_refunds=rows, refund_candidates=candidates)
    examples = result.metadata.get("examples")
    assert result.passed == (examples is None and result.metadata["provider_problems"].value == 0)
    return list(examples.value) if examples is not None else []


def test_the_duplicate_check_judges_what_reconciliation_listed_with_todays_wording() -> None:
    assert _provider_problems() == []
    assert _provider_problems(provider_refunds_with_key=[2, 1, 0]) == [
        "k-a: 2 refunds with this key at the provider"
    ]
    assert _provider_problems(
        provider_refunds_with_key=[0, 1, 0], provider_ids_with_key=["", "re_b", ""]
    ) == ["k-a: 0 refunds with this key at the provider"]
    assert _provider_problems(provider_ids_with_key=["re_x", "re_b", ""]) == [
        "k-a: provider refund re_x, we recorded re_a"
    ]
    assert _provider_problems(
        provider_refunds_for_reason=[1, 2, 0], provider_ids_for_reason=["re_a", "re_b, re_z", ""]
    ) == ["charge ch_b: 2 refunds for overcharge (re_b, re_z)"]
    # A row held for review was never refunded: what was (not) listed for it is no problem.
    assert _provider_problems(provider_refunds_with_key=[1, 1, 3]) == []


def test_the_duplicate_check_still_judges_our_own_records() -> None:
    rows, candidates = _reconciled(
        provider_id=["re_a", "re_a", ""], provider_ids_with_key=["re_a", "re_a", ""]
    )
    repeated = no_duplicate_refunds_at_provider(reconciled_refunds=rows, refund_candidates=candidates)
    assert not repeated.passed and repeated.severity == AssetCheckSeverity.ERROR
    assert repeated.metadata["repeated_refund_ids_in_our_records"].value == 1

    rows, candidates = _reconciled()
    unknown = no_duplicate_refunds_at_provider(reconciled_refunds=rows, refund_candidates=candidates.iloc[1:])
    assert not unknown.passed
    assert unknown.metadata["examples"].value == ["k-a: refunded invoice A is not a refund candidate"]

    moved = no_duplicate_refunds_at_provider(
        reconciled_refunds=rows, refund_candidates=candidates.assign(charge_id=["ch_a", "ch_other", "ch_c"])
    )
    assert not moved.passed
    assert moved.metadata["examples"].value == [
        "k-b: refunded charge ch_b, the approved candidate's is ch_other"
    ]

    same_charge = candidates.assign(charge_id=["ch_a", "ch_a", "ch_c"])
    twice = no_duplicate_refunds_at_provider(
        reconciled_refunds=rows.assign(charge_id=["ch_a", "ch_a", "ch_c"]), refund_candidates=same_charge
    )
    assert not twice.passed and twice.metadata["repeated_charge_reasons_in_our_records"].value == 1


def test_a_batch_reconciled_by_the_earlier_release_passes_on_what_that_release_checked() -> None:
    """A batch resumed across the upgrade: its stored reconciliation has no listing columns, and its
    provider was judged by this check on issued_refunds before reconciliation could run."""
    rows, candidates = _reconciled()
    old = rows.drop(columns=[c for c in rows.columns if c.startswith("provider_") and c != "provider_id"])
    result = no_duplicate_refunds_at_provider(reconciled_refunds=old, refund_candidates=candidates)
    assert result.passed, result.metadata
    assert "earlier release" in result.metadata["provider_judged_by"].value
    # Our own records are still judged.
    repeated = old.assign(provider_id=["re_a", "re_a", ""])
    assert not no_duplicate_refunds_at_provider(
        reconciled_refunds=repeated, refund_candidates=candidates
    ).passed


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


def test_every_money_check_blocks_what_comes_after_its_step() -> None:
    """Refunds that do not match their candidates or break a ceiling stop the batch before
    reconciliation; money paid twice at the provider stops it after reconciliation's read, before
    any customer notice."""
    blocking = {
        spec.name: spec.asset_key.path[-1] for c in ALL_CHECKS for spec in c.check_specs if spec.blocking
    }
    assert blocking == {
        "refunds_match_candidates": "issued_refunds",
        "refunds_within_batch_ceiling": "issued_refunds",
        "no_duplicate_refunds_at_provider": "reconciled_refunds",
    }
