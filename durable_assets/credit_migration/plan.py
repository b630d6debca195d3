"""The migration's plan: for each account, the target balance against the balance the provider holds.

Pure functions of frames, so the rules are unit-tested without a provider:

1. an account whose customer is held for review is held too (nothing to move a balance on), and so
   is one whose customer the provider no longer has (deleted after step 3 found it);
2. a customer whose balance is already in another currency is held: a Stripe balance has one
   currency, and converting credit is a decision for a person, not for a migration;
3. a balance already at the target needs nothing (the next night's batch over unchanged accounts
   sends no request);
4. a balance someone moved at the provider after this migration's last adjustment of it (its
   newest transaction is not ours, an earlier one is) is held with both figures: a person changed
   it on purpose or by mistake, and adjusting to the target would silently revert them, whether
   the export changed since or not;
5. otherwise one adjustment of exactly the difference, keyed by the balance version it was computed
   from (see :mod:`durable_assets.credit_migration.keys`).

A person's standing decision comes first (``job decide``): an account step 3 left without a customer
because a person decided so stays so, and one whose balance a person decided to keep is not
adjusted, whatever rule 2, 4 or 5 would say (rule 3 still reads "unchanged": nothing to keep).

The balances come from the customers list (a page of 100 customers per request) where that
settles them: a customer listed at its target, in its account's currency or with no currency yet,
needs nothing (rule 3), and its balance version is never read; a customer listed with no currency
has never had a balance transaction, so its balance is 0 with no version (a customer made by this
batch: night 1 reads none of them). Every other customer's newest balance transaction is read, one
request each, and gives the balance and its version.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence

import pandas as pd

from durable_assets.credit_migration import schema as s
from durable_assets.credit_migration.schema import CustomerOutcome, PlannedAction, ProviderChange
from durable_assets.kit.tables import typed
from durable_assets.payments.money import format_cents

#: Columns of the balances read by the plan step (one row per ready customer).
BALANCE_DTYPES: dict[str, str] = {
    "customer_id": "str",
    "current_cents": "int64",
    "current_currency": "str",
    "balance_version": "str",
    #: Where the newest transaction is not the migration's: the balance our last adjustment left
    #: and that adjustment's transaction id (0 and "" otherwise; rule 4).
    "migrated_cents": "int64",
    "migrated_by": "str",
    #: The provider answered 404 for the customer: deleted after step 3 found it (rule 1).
    "missing": "bool",
}


#: Columns of the customers list the plan step reads balances from (one row per listed customer;
#: ``balance_currency`` is "" for a customer whose balance has none yet).
LISTED_DTYPES: dict[str, str] = {"customer_id": "str", "balance": "int64", "balance_currency": "str"}


def never_moved(customer_id: str) -> dict[str, object]:
    """A balance no transaction ever moved: 0, no currency, no version, exactly what reading the
    customer's newest transaction answers when it has none."""
    return {
        "customer_id": customer_id,
        "current_cents": 0,
        "current_currency": "",
        "balance_version": "",
        "migrated_cents": 0,
        "migrated_by": "",
        "missing": False,
    }


def ids_named_in(note: str) -> set[str]:
    """The words of a review note, as provider ids: an id is named only as a whole word, so a note
    naming ``cus_12`` does not name ``cus_1``."""
    return set(re.findall(r"\w+", note))


def naming_every_customer(acct: str, note: str, at_provider: Sequence[str]) -> str:
    """A held account's note, naming every customer (``at_provider``: their ids) the provider holds
    for the account.

    The report is the provider's truth: a customer naming a held account is in no row's
    ``customer_id``, so its note is where the report accounts for it. A note replayed from the
    ledger (a refusal, a mismatch), or written by an earlier step, was written before such a
    customer may have been made.
    """
    ids = list(at_provider)
    if set(ids) <= ids_named_in(note):
        return note
    return f"{note}; provider customers naming legacy account {acct} now: {', '.join(ids)}"


def provider_change(
    acct: str, recorded: str, at_provider: Sequence[str], *, deleted: bool, names: str, when: str
) -> tuple[ProviderChange, str] | None:
    """What happened at the provider to the customer an account was found or made with
    (``recorded``), with the note that says so, or None when it is still the account's one customer.

    ``at_provider``: the live customers naming the account now; ``deleted`` and ``names`` (the
    legacy id its metadata names now): the recorded customer read by id, when it is not among them.
    ``when`` says since when ("after step 3 found it"). Each change is a person's decision, never
    the migration's: moving credit to a customer that is gone, shared or relabelled could give it to
    the wrong one. The note names every customer involved, so the report accounts for each.
    """
    if list(at_provider) == [recorded]:
        return None
    if recorded in at_provider:
        others = [c for c in at_provider if c != recorded]
        return ProviderChange.DUPLICATED, (
            f"customer {recorded} of legacy account {acct} was duplicated at the provider {when}: "
            f"{', '.join(others)} also name{'s' if len(others) == 1 else ''} the account; nothing more is "
            "moved for it: keep one (delete the others or re-label their metadata.legacy_account_id), "
            "then run the migration again"
        )
    if deleted:
        return ProviderChange.DELETED, naming_every_customer(
            acct, _deleted_note(acct, recorded, when), at_provider
        )
    note = (
        f"customer {recorded}'s metadata.legacy_account_id was changed at the provider by hand {when}: "
        f"it names {names!r}, not {acct!r}; nothing more is moved for it: if it is still this "
        f"account's customer, set it back to {acct!r} and run the migration again"
    )
    return ProviderChange.RELABELLED, naming_every_customer(acct, note, at_provider)


def _note_where(note: pd.Series, mask: pd.Series, notes: Iterable[str]) -> None:
    """Set ``note`` on the rows of ``mask`` to ``notes``, one per such row in order.

    Why a helper: the plan words four kinds of held or decided rows, each from its own columns;
    only the wording differs, and a mask with no row builds no series at all.
    """
    if mask.any():
        note[mask] = pd.Series(list(notes), index=note.index[mask], dtype="str")


def _deleted_note(acct: str, customer: str, when: str) -> str:
    return (
        f"customer {customer}, which legacy account {acct} is migrated to, was deleted at the provider "
        f"{when}; nothing more is moved for it: make the account's customer again at the provider (the "
        "next night adopts it) or leave the account without one"
    )


def recorded_elsewhere(customers: pd.DataFrame, at_provider: Mapping[str, Sequence[str]]) -> list[str]:
    """The ready customers (step 3's frame) the provider's list no longer shows under their
    account: each is read by id to tell a delete from a re-label (one request each, rare)."""
    ready = customers[customers["status"] == CustomerOutcome.READY]
    return [
        str(cus)
        for acct, cus in zip(ready[s.LEGACY_ACCOUNT_ID], ready["customer_id"], strict=True)
        if str(cus) not in at_provider.get(str(acct), [])
    ]


def confine_provider_changes(
    customers: pd.DataFrame,
    at_provider: Mapping[str, Sequence[str]],
    read_by_id: Mapping[str, tuple[bool, str]],
    *,
    when: str,
) -> tuple[pd.DataFrame, Counter[ProviderChange]]:
    """Step 3's frame as the provider stands now: an account whose customer was deleted, duplicated
    or re-labelled since is held with a note saying so, and every held account's note names every
    customer naming it now (one made by hand since included); and how many of each change.

    ``read_by_id``: for each customer of :func:`recorded_elsewhere`, (deleted, the legacy id it
    names now).
    """
    out = customers.copy()
    changes: Counter[ProviderChange] = Counter()
    statuses, notes = [], []
    for acct, cus, status, note in zip(
        out[s.LEGACY_ACCOUNT_ID], out["customer_id"], out["status"], out["review_note"], strict=True
    ):
        found = list(at_provider.get(str(acct), []))
        if status == CustomerOutcome.READY:
            deleted, names = read_by_id.get(str(cus), (False, str(acct)))
            change = provider_change(str(acct), str(cus), found, deleted=deleted, names=names, when=when)
            if change is not None:
                changes[change[0]] += 1
                statuses.append(CustomerOutcome.HELD_FOR_REVIEW.value)
                notes.append(change[1])
                continue
            statuses.append(str(status))
            notes.append(str(note))
            continue
        statuses.append(str(status))
        notes.append(naming_every_customer(str(acct), str(note), found))
    out["status"] = pd.Series(statuses, index=out.index, dtype="str")
    out["review_note"] = pd.Series(notes, index=out.index, dtype="str")
    return typed(out, s.CUSTOMER_DTYPES), changes


def target_cents(credit_cents: pd.Series) -> pd.Series:
    """Credit owed to the customer is a negative balance (Stripe's sign)."""
    return (-credit_cents).astype("int64")


def plan_adjustments(
    accounts: pd.DataFrame,
    customers: pd.DataFrame,
    balances: pd.DataFrame,
    kept: Mapping[str, str] | None = None,
) -> pd.DataFrame:
    """One row per account of ``accounts`` (:data:`schema.PLAN_DTYPES`), in the accounts' order.
    ``kept``: legacy account id -> a person's decision to keep the provider's balance, described."""
    merged = (
        accounts[[s.LEGACY_ACCOUNT_ID, s.CURRENCY, "credit_cents"]]
        .merge(
            customers[[s.LEGACY_ACCOUNT_ID, "customer_id", "status", "review_note"]],
            on=s.LEGACY_ACCOUNT_ID,
            how="left",
        )
        .merge(typed(balances, BALANCE_DTYPES), on="customer_id", how="left")
    )
    missing = merged["missing"].fillna(False).astype(bool)
    ready = (merged["status"] == CustomerOutcome.READY).fillna(False).astype(bool) & ~missing
    current = merged["current_cents"].fillna(0).astype("int64")
    current_currency = merged["current_currency"].fillna("").astype("str")
    target = target_cents(merged["credit_cents"])
    other_currency = ready & (current_currency != "") & (current_currency != merged[s.CURRENCY])
    unchanged = ready & ~other_currency & (current == target)
    by_hand = ready & ~other_currency & ~unchanged & (merged["migrated_by"].fillna("") != "")
    decided = (merged["status"] == CustomerOutcome.DECIDED_BY_PERSON).fillna(False).astype(bool)
    keep = ready & ~unchanged & merged[s.LEGACY_ACCOUNT_ID].isin(list(kept or {}))

    action = pd.Series(PlannedAction.ADJUST.value, index=merged.index, dtype="str")
    action[unchanged] = PlannedAction.UNCHANGED.value
    action[~ready | other_currency | by_hand] = PlannedAction.HELD_FOR_REVIEW.value
    action[decided | keep] = PlannedAction.DECIDED_BY_PERSON.value
    # A ready customer's note is what step 3 wants the report to say of it (a replacement adopted).
    note = merged["review_note"].fillna("").astype("str")
    note[~ready] = merged.loc[~ready, "review_note"].fillna("no provider customer").astype("str")
    _note_where(
        note,
        missing,
        (
            _deleted_note(str(acct), str(cus), "after this batch found it (it answers 404)")
            for acct, cus in zip(
                merged.loc[missing, s.LEGACY_ACCOUNT_ID], merged.loc[missing, "customer_id"], strict=True
            )
        ),
    )
    _note_where(
        note,
        other_currency,
        (
            f"customer {cus}'s balance is {format_cents(int(cur), str(ccy))}; the legacy account's "
            f"credit is in {str(want).upper()} and a balance has one currency: convert it by hand"
            for cus, cur, ccy, want in merged.loc[
                other_currency, ["customer_id", "current_cents", "current_currency", s.CURRENCY]
            ].itertuples(index=False)
        ),
    )
    _note_where(
        note,
        by_hand,
        (
            _changed_by_hand_note(str(cus), int(cur), int(left), str(txn), int(want), str(ccy))
            for cus, cur, left, txn, want, ccy in zip(
                merged.loc[by_hand, "customer_id"],
                current[by_hand],
                merged.loc[by_hand, "migrated_cents"],
                merged.loc[by_hand, "migrated_by"],
                target[by_hand],
                merged.loc[by_hand, s.CURRENCY],
                strict=True,
            )
        ),
    )
    _note_where(
        note,
        keep,
        (
            f"customer {cus}'s balance {format_cents(int(cur), str(ccy))} kept at the provider "
            f"(target {format_cents(int(want), str(ccy))}): {(kept or {})[str(acct)]}"
            for acct, cus, cur, want, ccy in zip(
                merged.loc[keep, s.LEGACY_ACCOUNT_ID],
                merged.loc[keep, "customer_id"],
                current[keep],
                target[keep],
                merged.loc[keep, s.CURRENCY],
                strict=True,
            )
        ),
    )
    plan = pd.DataFrame(
        {
            s.LEGACY_ACCOUNT_ID: merged[s.LEGACY_ACCOUNT_ID],
            "customer_id": merged["customer_id"].fillna(""),
            s.CURRENCY: merged[s.CURRENCY],
            "target_cents": target,
            "current_cents": current,
            "balance_version": merged["balance_version"].fillna(""),
            "adjustment_cents": (target - current).where(action == PlannedAction.ADJUST.value, 0),
            "action": action,
            "review_note": note,
        }
    )
    return typed(plan, s.PLAN_DTYPES)


def _changed_by_hand_note(
    customer: str, now: int, left: int, transaction: str, target: int, currency: str
) -> str:
    export = (
        "the export has not changed since"
        if left == target
        else f"the export's target is now {format_cents(target, currency)}"
    )
    return (
        f"customer {customer}'s balance was changed at the provider outside this migration: it is "
        f"{format_cents(now, currency)}, the migration left it at {format_cents(left, currency)} "
        f"(balance transaction {transaction}) and {export}; not reverted: if the change was a mistake, "
        "set the balance to the target at the provider; until then every night holds the account"
    )


def balances_at_target(accounts: pd.DataFrame, customers: pd.DataFrame, listed: pd.DataFrame) -> pd.DataFrame:
    """The balances (:data:`BALANCE_DTYPES`, no version) of the ready customers the list shows at
    their account's target already, in the account's currency or with none yet: rule 3 holds for
    them whatever their newest transaction is, so it is not read. A customer named by two accounts
    is settled only if it is at both targets; one not listed is not settled here (it is read)."""
    ready = customers.loc[customers["status"] == CustomerOutcome.READY, [s.LEGACY_ACCOUNT_ID, "customer_id"]]
    merged = ready.merge(
        accounts[[s.LEGACY_ACCOUNT_ID, s.CURRENCY, "credit_cents"]], on=s.LEGACY_ACCOUNT_ID
    ).merge(typed(listed, LISTED_DTYPES), on="customer_id")
    same_currency = (merged["balance_currency"] == "") | (merged["balance_currency"] == merged[s.CURRENCY])
    at_target = same_currency & (merged["balance"] == target_cents(merged["credit_cents"]))
    missed = set(merged.loc[~at_target, "customer_id"])
    settled = merged[at_target & ~merged["customer_id"].isin(missed)].drop_duplicates("customer_id")
    balances = pd.DataFrame(
        {
            "customer_id": settled["customer_id"],
            "current_cents": settled["balance"],
            "current_currency": settled["balance_currency"],
            "balance_version": "",
            "migrated_cents": 0,
            "migrated_by": "",
            "missing": False,
        },
        columns=list(BALANCE_DTYPES),
    )
    return typed(balances, BALANCE_DTYPES)


def balances_never_moved(customers: pd.DataFrame, listed: pd.DataFrame) -> pd.DataFrame:
    """The balances (:data:`BALANCE_DTYPES`) of the ready customers the list shows with a zero balance
    and no currency: no balance transaction was ever applied to them (the first one sets the
    customer's currency, and nothing unsets it), so their balance is 0 with no version, exactly what
    reading their newest transaction would answer (none). A customer just made by this batch is one:
    its balance need not be read before its first adjustment."""
    ready = customers.loc[customers["status"] == CustomerOutcome.READY, ["customer_id"]].drop_duplicates()
    merged = ready.merge(typed(listed, LISTED_DTYPES), on="customer_id")
    untouched = merged[(merged["balance_currency"] == "") & (merged["balance"] == 0)]
    balances = pd.DataFrame(
        [never_moved(str(c)) for c in untouched["customer_id"]], columns=list(BALANCE_DTYPES)
    )
    return typed(balances, BALANCE_DTYPES)
