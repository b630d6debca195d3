"""Asset checks that guard money, shown beside each batch's materializations in the Dagster UI.

The refund step already fails closed before its first request (guardrails) and holds odd answers for
review; these checks verify the *outcome* afterwards, from outside the code that produced it. Three
are blocking: the two on ``issued_refunds`` stop the batch's run before reconciliation, and
``no_duplicate_refunds_at_provider`` on ``reconciled_refunds`` stops it before the customer notices,
so no customer is told about money whose books do not balance. Every check reads stored frames only:
the duplicate check judges what reconciliation's one listing of each refunded charge found there.
"""

# No `from __future__ import annotations`: Dagster reads these annotations at definition time.
from collections.abc import Hashable, Mapping
from typing import Any

import pandas as pd
from dagster import AssetCheckResult, AssetCheckSeverity, MetadataValue

from durable_assets.kit.reports import HELD_FOR_REVIEW_KEY, batch_check, check_examples
from durable_assets.kit.tables import typed
from durable_assets.refunds import schema as s
from durable_assets.refunds.assets import BATCHES, issued_refunds, reconciled_refunds
from durable_assets.refunds.resources import RefundLimits


@batch_check(asset=issued_refunds, partitions_def=BATCHES, blocking=True, reads=["refund_candidates"])
def refunds_match_candidates(
    issued_refunds: pd.DataFrame, refund_candidates: pd.DataFrame
) -> AssetCheckResult:
    """Every approved refund candidate has exactly one outcome, for exactly the approved amount.

    ERROR (blocks notices) when a candidate is missing, duplicated or refunded with another amount
    or currency; WARN when refunds are held for review (a person must look, nothing else is wrong).
    """
    want = refund_candidates[[s.INVOICE_ID, "refund_cents", s.CURRENCY]].rename(
        columns={"refund_cents": "amount_cents"}
    )
    got = issued_refunds[[s.INVOICE_ID, "amount_cents", s.CURRENCY, "status"]]
    merged = want.merge(got, on=s.INVOICE_ID, how="outer", suffixes=("_approved", "_issued"), indicator=True)
    missing = merged.loc[merged["_merge"] == "left_only", s.INVOICE_ID]
    unexpected = merged.loc[merged["_merge"] == "right_only", s.INVOICE_ID]
    duplicated = got.loc[got[s.INVOICE_ID].duplicated(), s.INVOICE_ID]
    both = merged[merged["_merge"] == "both"]
    wrong = both.loc[
        (both["amount_cents_approved"] != both["amount_cents_issued"])
        | (both[f"{s.CURRENCY}_approved"] != both[f"{s.CURRENCY}_issued"]),
        s.INVOICE_ID,
    ]
    refunded = got[got["status"] == s.RefundOutcome.REFUNDED]
    held = got.loc[got["status"] != s.RefundOutcome.REFUNDED, s.INVOICE_ID]
    broken = len(missing) + len(unexpected) + len(duplicated) + len(wrong)
    metadata: dict[str, Any] = {
        "approved": len(want),
        "refunded": len(refunded),
        "approved_cents": int(want["amount_cents"].sum()),
        "refunded_cents": int(refunded["amount_cents"].sum()),
        HELD_FOR_REVIEW_KEY: len(held),
        "missing": len(missing),
        "unexpected": len(unexpected),
        "duplicated": len(duplicated),
        "wrong_amount_or_currency": len(wrong),
    }
    for name, ids in (("missing", missing), ("unexpected", unexpected), ("wrong", wrong), ("held", held)):
        if len(ids):
            metadata[f"examples_{name}"] = check_examples(ids)
    if broken:
        return AssetCheckResult(passed=False, severity=AssetCheckSeverity.ERROR, metadata=metadata)
    return AssetCheckResult(passed=not len(held), severity=AssetCheckSeverity.WARN, metadata=metadata)


@batch_check(asset=issued_refunds, partitions_def=BATCHES, blocking=True)
def refunds_within_batch_ceiling(issued_refunds: pd.DataFrame, limits: RefundLimits) -> AssetCheckResult:
    """What was actually refunded stays within the per-batch ceilings (``RefundLimits``).

    The refund step refuses an over-ceiling batch before its first request; this re-checks the
    result, so a bug in that guard, or limits lowered since, cannot go unnoticed.
    """
    refunded = issued_refunds[issued_refunds["status"] == s.RefundOutcome.REFUNDED]
    by_currency = {str(k): int(v) for k, v in refunded.groupby(s.CURRENCY)["amount_cents"].sum().items()}
    over = {cur: cents for cur, cents in by_currency.items() if cents > limits.max_amount_per_batch_cents}
    too_many = len(refunded) > limits.max_refunds_per_batch
    return AssetCheckResult(
        passed=not over and not too_many,
        severity=AssetCheckSeverity.ERROR,
        metadata={
            "refunds": len(refunded),
            "max_refunds_per_batch": limits.max_refunds_per_batch,
            "refunded_by_currency_cents": MetadataValue.json(by_currency),
            "max_amount_per_batch_cents": limits.max_amount_per_batch_cents,
            "currencies_over_ceiling": MetadataValue.json(over),
        },
    )


@batch_check(asset=reconciled_refunds, partitions_def=BATCHES, blocking=True, reads=["refund_candidates"])
def no_duplicate_refunds_at_provider(
    reconciled_refunds: pd.DataFrame, refund_candidates: pd.DataFrame
) -> AssetCheckResult:
    """The provider holds exactly one refund per idempotency key, and at most one per charge and reason.

    Two refunds with one key would mean exactly-once was broken somewhere (a provider that forgot a
    key, a second system sending our keys); two of our refunds of one charge for one reason — from
    another invoice row, or an earlier batch — would mean the charge was paid back twice. Either is
    money paid twice. Reconciliation listed every refund of each refunded charge (all pages) and
    kept what it found there; this judges that, with no request of its own, and blocks the customer
    notices. Our own records are checked for repeated keys, refund IDs and charge-reason pairs too.
    """
    # A batch reconciled by an earlier release (resumed across the upgrade) has no listing columns:
    # this check then ran on issued_refunds, before reconciliation, which it blocked; it passed.
    listed = "provider_refunds_with_key" in reconciled_refunds.columns
    rows = typed(reconciled_refunds, s.RECONCILED_DTYPES)
    refunded = rows[rows["status"] == s.RefundOutcome.REFUNDED]
    repeated_keys = refunded.loc[refunded["idempotency_key"].duplicated(), "idempotency_key"]
    repeated_ids = refunded.loc[refunded["provider_id"].duplicated(), "provider_id"]
    charges = refund_candidates.set_index(s.INVOICE_ID)[s.CHARGE_ID].astype(str)
    charge_of = refunded[s.INVOICE_ID].map(charges)
    repeated_charges = refunded.loc[
        pd.DataFrame({"c": charge_of, "r": refunded["reason"]}).duplicated(), s.INVOICE_ID
    ]
    problems = (
        [p for row in refunded.to_dict("records") for p in _duplicates_at_provider(row, charges)]
        if listed
        else []
    )
    passed = not problems and not len(repeated_keys) and not len(repeated_ids) and not len(repeated_charges)
    metadata: dict[str, Any] = {
        "refunds_checked": len(refunded),
        "provider_problems": len(problems),
        "repeated_keys_in_our_records": len(repeated_keys),
        "repeated_refund_ids_in_our_records": len(repeated_ids),
        "repeated_charge_reasons_in_our_records": len(repeated_charges),
    }
    if not listed:
        metadata["provider_judged_by"] = (
            "this check on issued_refunds, before reconciliation (earlier release)"
        )
    if problems:
        metadata["examples"] = check_examples(problems)
    return AssetCheckResult(passed=passed, severity=AssetCheckSeverity.ERROR, metadata=metadata)


def _duplicates_at_provider(row: Mapping[Hashable, Any], charges: "pd.Series[str]") -> list[str]:
    """What one refunded row's charge listing (read by reconciliation) says is wrong. The charge is
    the approved candidate's, not the row's own word for it: a refund recorded against another
    charge than the one approved is a problem in itself."""
    key = str(row["idempotency_key"])
    charge_id = charges.get(row[s.INVOICE_ID])
    if charge_id is None:
        return [f"{key}: refunded invoice {row[s.INVOICE_ID]} is not a refund candidate"]
    problems = []
    if row[s.CHARGE_ID] != charge_id:
        problems.append(f"{key}: refunded charge {row[s.CHARGE_ID]}, the approved candidate's is {charge_id}")
    with_key = int(row["provider_refunds_with_key"])
    if with_key != 1:
        problems.append(f"{key}: {with_key} refunds with this key at the provider")
    elif (at_provider := row["provider_ids_with_key"]) != row["provider_id"]:
        problems.append(f"{key}: provider refund {at_provider}, we recorded {row['provider_id']}")
    for_reason = int(row["provider_refunds_for_reason"])
    if for_reason > 1:
        ids = row["provider_ids_for_reason"]
        problems.append(f"charge {charge_id}: {for_reason} refunds for {row['reason']} ({ids})")
    return problems


@batch_check(asset=reconciled_refunds, partitions_def=BATCHES)
def provider_agrees_with_our_records(reconciled_refunds: pd.DataFrame) -> AssetCheckResult:
    """Every refund read back from the provider matches what we recorded (amount, currency, status).

    Not blocking: mismatched refunds already get no customer notice; this makes them visible.
    """
    mismatched = reconciled_refunds[reconciled_refunds["reconciliation"] == "mismatch"]
    metadata: dict[str, Any] = {
        "matched": int((reconciled_refunds["reconciliation"] == "matched").sum()),
        "mismatched": len(mismatched),
    }
    if len(mismatched):
        metadata["examples"] = check_examples(mismatched[s.INVOICE_ID])
    return AssetCheckResult(passed=not len(mismatched), severity=AssetCheckSeverity.ERROR, metadata=metadata)


ALL_CHECKS = [
    refunds_match_candidates,
    refunds_within_batch_ceiling,
    no_duplicate_refunds_at_provider,
    provider_agrees_with_our_records,
]
