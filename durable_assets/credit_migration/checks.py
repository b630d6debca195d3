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
from http import HTTPStatus
from typing import Any

import pandas as pd
from dagster import AssetCheckResult

from durable_assets.credit_migration import schema as s
from durable_assets.credit_migration.assets import (
    CREDIT_BATCHES,
    applied_adjustments,
    provider_customers,
    verified_balances,
)
from durable_assets.credit_migration.listing import every_customer
from durable_assets.credit_migration.plan import ids_named_in, provider_change, recorded_elsewhere
from durable_assets.credit_migration.resources import CreditLimits
from durable_assets.credit_migration.schema import (
    VERIFICATION_OF_CHANGE,
    AdjustmentOutcome,
    CustomerOutcome,
    ProviderChange,
    Verification,
)
from durable_assets.errors import ProviderRejectedError
from durable_assets.kit import paced_map
from durable_assets.kit.reports import batch_check, check_examples, check_result
from durable_assets.payments.resources import PaymentGateway


@batch_check(asset=provider_customers, partitions_def=CREDIT_BATCHES, blocking=True)
def one_customer_per_account(provider_customers: pd.DataFrame, payments: PaymentGateway) -> AssetCheckResult:
    """Exactly one provider customer per migrated legacy account, and it is the one we recorded; or,
    where the provider changed since step 3 listed its customers (a customer deleted, a second one
    made, one re-labelled by hand, one made for a held account), that change counted.

    Two customers for one account would split its credit (or double it on the next migration); but
    a change made at the provider while the batch runs is one account's, not the batch's: step 4
    reads the provider again and holds that account with a note saying what happened, naming every
    customer involved. So such changes are counted here (``changed_at_provider``, and by kind), and
    the check fails only for what no account can hold: one customer recorded for two accounts, or a
    recorded customer the provider says still names its account but leaves out of its list.
    Every customer of the provider account is listed once, through all pages (each page paced), and
    a recorded customer the list does not show under its account is read by id (one request each).
    """
    listed = every_customer(payments)
    at_provider: dict[str, list[str]] = {}
    for customer in listed:
        legacy = customer.metadata.get(s.LEGACY_ID_METADATA)
        if legacy:
            at_provider.setdefault(legacy, []).append(customer.id)
    ready = provider_customers[provider_customers["status"] == CustomerOutcome.READY]
    elsewhere = recorded_elsewhere(provider_customers, at_provider)
    customers = payments.customers
    read = paced_map(
        lambda cid: {"customer": customers.retrieve_customer(cid)},
        elsewhere,
        payments,
    )
    read_by_id = {
        cid: (bool(a["customer"].deleted), str(a["customer"].metadata.get(s.LEGACY_ID_METADATA, "")))
        for cid, a in zip(elsewhere, read, strict=True)
    }
    problems, changes = customer_changes(provider_customers, at_provider, read_by_id)
    repeated = ready.loc[ready["customer_id"].duplicated(), "customer_id"]
    problems += [f"customer {c} recorded for two accounts" for c in repeated]
    return check_result(
        problems,
        {
            "accounts_checked": len(ready),
            "held_accounts_checked": len(provider_customers) - len(ready),
            "customers_listed": len(listed),
            "changed_at_provider": sum(changes.values()),
            **{f"customers_{kind}": changes.get(kind, 0) for kind in CHANGE_KINDS},
        },
    )


#: What :func:`customer_changes` counts: the provider changes of :class:`ProviderChange`, and a
#: customer made by hand for an account held in step 3 (step 4 names it in the account's note).
CHANGE_KINDS = (*(c.value for c in ProviderChange), "made_for_held")


def customer_changes(
    rows: pd.DataFrame,
    at_provider: Mapping[str, list[str]],
    read_by_id: Mapping[str, tuple[bool, str]] | None = None,
) -> tuple[list[str], Counter[str]]:
    """Each row of step 3 against the provider's customers naming its account (``at_provider``):
    the problems no account can hold, and the changes at the provider, counted by kind.

    A ready row must be its one customer, or the provider changed since (see
    :func:`durable_assets.credit_migration.plan.provider_change`; ``read_by_id``: the recorded
    customers the list does not show under their account, as (deleted, legacy id named) — a
    recorded customer that still names its account although the list left it out is a problem: the
    provider's list cannot be trusted). A held row has no customer we migrate to; a customer the
    provider holds for it that its note does not name (as a whole word) was made since step 3
    listed them: counted, and step 4 names it in the note.
    """
    problems: list[str] = []
    changes: Counter[str] = Counter()
    read = read_by_id or {}
    for acct, recorded, status, note in zip(
        rows[s.LEGACY_ACCOUNT_ID], rows["customer_id"], rows["status"], rows["review_note"], strict=True
    ):
        found = at_provider.get(str(acct), [])
        if status == CustomerOutcome.READY:
            if found == [recorded]:
                continue
            if str(recorded) not in found and str(recorded) not in read:
                problems.append(f"{acct}: provider customers {found}, we recorded {recorded}")
                continue
            deleted, names = read.get(str(recorded), (False, str(acct)))
            if str(recorded) not in found and not deleted and names == str(acct):
                problems.append(
                    f"{acct}: customer {recorded} names the account but the provider's list of its "
                    f"customers shows {found}"
                )
                continue
            change = provider_change(str(acct), str(recorded), found, deleted=deleted, names=names, when="")
            if change is not None:
                changes[change[0].value] += 1
            continue
        named = ids_named_in(str(note))
        changes["made_for_held"] += sum(1 for c in found if c != recorded and c not in named)
    return problems, changes


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
        try:
            listed = customers.list_balance_transactions(str(row["customer_id"]))
        except ProviderRejectedError as exc:
            if (
                exc.http_status != HTTPStatus.NOT_FOUND
                or not customers.retrieve_customer(str(row["customer_id"])).deleted
            ):
                raise
            # Deleted at the provider since step 5: its transactions went with it, nothing of it can
            # be double-counted any more, and step 6 holds the account saying so. Counted.
            return {"problems": [], "deleted": 1}
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
        payments,
    )
    problems = [p for a in answers for p in a["problems"]]
    repeated = applied.loc[applied["idempotency_key"].duplicated(), "idempotency_key"]
    problems += [f"key {k} recorded twice" for k in repeated]
    deleted = sum(int(a.get("deleted", 0)) for a in answers)
    return check_result(
        problems,
        {
            "adjustments_checked": len(applied),
            "unapplied_keys_checked": len(keyed),
            "changed_at_provider": deleted,
            "customers_deleted": deleted,
        },
    )


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
    changed = [v.value for v in VERIFICATION_OF_CHANGE.values()]
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
            "changed_at_provider": int(verified_balances["verification"].isin(changed).sum()),
            "mismatched": len(mismatched),
            "not_migrated": int((verified_balances["verification"] == Verification.NOT_MIGRATED).sum()),
        },
    )


ALL_CHECKS = [one_customer_per_account, no_adjustment_applied_twice, balances_match_targets]
