"""Asset checks that guard the migrated money, beside each batch's materializations in the UI.

The steps fail closed before their first request (ceilings) and hold odd answers for review; these
checks verify the *outcome* from outside the code that produced it, and all three are blocking: a
failure stops the batch before its report, so nobody reads a report whose books do not balance. A
problem of one account (a second customer made by hand, a balance moved by someone else) holds that
account for review instead; a check fails the batch only for what cannot be confined to accounts.

Both ways: the report is the provider's truth, so every provider object made for the batch's
accounts must be accounted for in it, not only the ones the report says were made. The steps name
in a held row what the provider holds for it; an object no row accounts for means the report is
wrong, which is no one account's problem, so it fails the batch (a customer made after step 3
listed the customers is named once step 3 runs again).

- ``one_customer_per_account``: the provider holds exactly one customer per migrated legacy account,
  and every customer naming an account of the batch is in that account's row (its customer, or
  named in a held row's note); read by listing the account's customers once: one request per 100
  customers.
- ``no_adjustment_applied_twice``: each adjusted customer's balance transactions hold our key once,
  and no key twice; a row the report shows as not applied, but with a key, has no transaction under
  that key which the row does not name (one request per applied or such row).
- ``balances_match_targets``: what moved is within the per-batch ceilings; balances read back that
  missed their target are counted (their accounts are held for review in the report, not failed).
"""

# No `from __future__ import annotations`: Dagster reads these annotations at definition time.
from collections import Counter
from collections.abc import Mapping
from typing import Any

import pandas as pd
from dagster import AssetCheckResult

from durable_assets.credit_migration import schema as s
from durable_assets.credit_migration.assets import (
    CREDIT_BATCHES,
    applied_adjustments,
    ids_named_in,
    provider_customers,
    verified_balances,
)
from durable_assets.credit_migration.listing import every_customer
from durable_assets.credit_migration.resources import CreditLimits
from durable_assets.credit_migration.schema import AdjustmentOutcome, CustomerOutcome, Verification
from durable_assets.kit import batch_check, check_examples, check_result, paced_map
from durable_assets.payments.resources import PaymentGateway


@batch_check(asset=provider_customers, partitions_def=CREDIT_BATCHES, blocking=True)
def one_customer_per_account(provider_customers: pd.DataFrame, payments: PaymentGateway) -> AssetCheckResult:
    """Exactly one provider customer per migrated legacy account, it is the one we recorded, and no
    customer naming an account of the batch is missing from the report.

    Two customers for one account would split its credit (or double it on the next migration). A
    held account is not migrated, but a customer the provider holds for it and the report does not
    name (made by hand after step 3 listed the customers) would be found by no one.
    Every customer of the provider account is listed once, through all pages (each page paced).
    """
    listed = every_customer(payments)
    at_provider: dict[str, list[str]] = {}
    for customer in listed:
        legacy = customer.metadata.get(s.LEGACY_ID_METADATA)
        if legacy:
            at_provider.setdefault(legacy, []).append(customer.id)
    ready = provider_customers[provider_customers["status"] == CustomerOutcome.READY]
    problems = customer_problems(provider_customers, at_provider)
    repeated = ready.loc[ready["customer_id"].duplicated(), "customer_id"]
    problems += [f"customer {c} recorded for two accounts" for c in repeated]
    return check_result(
        problems,
        {
            "accounts_checked": len(ready),
            "held_accounts_checked": len(provider_customers) - len(ready),
            "customers_listed": len(listed),
        },
    )


def customer_problems(rows: pd.DataFrame, at_provider: Mapping[str, list[str]]) -> list[str]:
    """Each row of step 3 against the provider's customers naming its account (``at_provider``).

    A ready row must be exactly its one customer. A held row has no customer to migrate to, so it
    accounts for the provider's customers in words: each must be named in its ``review_note`` (step
    3 names there every customer it saw naming the account), as a whole word.
    """
    problems: list[str] = []
    for acct, recorded, status, note in zip(
        rows[s.LEGACY_ACCOUNT_ID], rows["customer_id"], rows["status"], rows["review_note"], strict=True
    ):
        found = at_provider.get(str(acct), [])
        if status == CustomerOutcome.READY:
            if found != [recorded]:
                problems.append(f"{acct}: provider customers {found}, we recorded {recorded}")
            continue
        named = ids_named_in(str(note))
        problems += [
            f"{acct}: provider customer {c} is not in the report"
            for c in found
            if c != recorded and c not in named
        ]
    return problems


@batch_check(asset=applied_adjustments, partitions_def=CREDIT_BATCHES, blocking=True)
def no_adjustment_applied_twice(
    applied_adjustments: pd.DataFrame, payments: PaymentGateway
) -> AssetCheckResult:
    """Each adjustment we applied is exactly one balance transaction at the provider; no key repeats;
    and no adjustment the report shows as not applied has a transaction there under its key.

    Two transactions under one key would mean credit was given twice (a provider that forgot a key,
    another system sending our keys). A transaction under the key of a row the report shows as held
    for review (or unchanged) is money that moved while the report says it did not: the row must
    name it (step 5 does for an answer it held), else it is a problem. Reads every balance
    transaction of each applied or such row's customer, one paced listing per row.
    """
    applied = applied_adjustments[applied_adjustments["status"] == AdjustmentOutcome.APPLIED]
    keyed = applied_adjustments[
        (applied_adjustments["status"] != AdjustmentOutcome.APPLIED)
        & (applied_adjustments["customer_id"] != "")
        & (applied_adjustments["idempotency_key"] != "")
    ]
    customers = payments.customers

    def probe(row: Mapping[Any, Any]) -> Mapping[str, Any]:
        listed = customers.list_balance_transactions(str(row["customer_id"]))
        keys = Counter(t.idempotency_key for t in listed)
        problems = [
            f"{row['customer_id']}: key {k} applied {n} times" for k, n in keys.items() if k and n > 1
        ]
        key = str(row["idempotency_key"])
        if row["status"] == AdjustmentOutcome.APPLIED:
            if keys.get(key, 0) == 0:
                problems.append(f"{row['customer_id']}: no transaction with key {key}")
            return {"problems": problems}
        unnamed = [t.id for t in listed if t.idempotency_key == key and t.id != row["transaction_id"]]
        if unnamed:
            problems.append(
                f"{row[s.LEGACY_ACCOUNT_ID]}: balance transaction {', '.join(unnamed)} of customer "
                f"{row['customer_id']} carries key {key}, but the report shows the adjustment "
                f"{row['status']}, not applied"
            )
        return {"problems": problems}

    answers = paced_map(
        probe,
        [*applied.to_dict("records"), *keyed.to_dict("records")],
        payments.limiter(),
        payments.backoff(),
        concurrency=payments.concurrency,
    )
    problems = [p for a in answers for p in a["problems"]]
    repeated = applied.loc[applied["idempotency_key"].duplicated(), "idempotency_key"]
    problems += [f"key {k} recorded twice" for k in repeated]
    return check_result(problems, {"adjustments_checked": len(applied), "unapplied_keys_checked": len(keyed)})


@batch_check(
    asset=verified_balances, partitions_def=CREDIT_BATCHES, blocking=True, reads=["applied_adjustments"]
)
def balances_match_targets(
    verified_balances: pd.DataFrame, applied_adjustments: pd.DataFrame, credit_limits: CreditLimits
) -> AssetCheckResult:
    """What moved stays within the per-batch ceilings (``CreditLimits``), so neither a bug in the guard
    nor a changed limit goes unnoticed: that cannot be confined to one account, so it fails the batch.

    A balance read back that is not its target (someone moved it since the plan) is one account's
    problem: the report holds that account for review, and the rest of the batch is not failed for
    it. Mismatched and held accounts are counted here, with examples, for whoever reviews them."""
    mismatched = verified_balances[verified_balances["verification"] == Verification.MISMATCH]
    problems: list[str] = []
    applied = applied_adjustments[applied_adjustments["status"] == AdjustmentOutcome.APPLIED]
    moved = applied.assign(moved=applied["adjustment_cents"].abs()).groupby(s.CURRENCY)["moved"].sum()
    over = {str(k): int(v) for k, v in moved.items() if v > credit_limits.max_credit_per_batch_cents}
    if over:
        problems.append(f"credit moved above the per-batch ceiling: {over}")
    if len(applied) > credit_limits.max_adjustments_per_batch:
        problems.append(
            f"{len(applied)} adjustments above the ceiling of {credit_limits.max_adjustments_per_batch}"
        )
    return check_result(
        problems,
        {
            "mismatched_examples": check_examples(
                f"{acct}: balance {got}, target {want}"
                for acct, got, want in zip(
                    mismatched[s.LEGACY_ACCOUNT_ID],
                    mismatched["provider_balance_cents"],
                    mismatched["target_cents"],
                    strict=True,
                )
            ),
            "matched": int((verified_balances["verification"] == Verification.MATCHED).sum()),
            "mismatched": len(mismatched),
            "not_migrated": int((verified_balances["verification"] == Verification.NOT_MIGRATED).sum()),
        },
    )


ALL_CHECKS = [one_customer_per_account, no_adjustment_applied_twice, balances_match_targets]
