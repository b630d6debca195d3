"""The migration's plan rules on small hand-made frames, and the per-batch ceilings (pure functions)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd
import pytest

from durable_assets.credit_migration import schema as s
from durable_assets.credit_migration.assets import enforce_credit_limits, verify_adjustment
from durable_assets.credit_migration.errors import CreditCeilingExceededError
from durable_assets.credit_migration.plan import (
    BALANCE_DTYPES,
    LISTED_DTYPES,
    balances_at_target,
    balances_never_moved,
    plan_adjustments,
    target_cents,
)
from durable_assets.credit_migration.resources import CreditLimits
from durable_assets.credit_migration.schema import CustomerOutcome, PlannedAction
from durable_assets.errors import GuardrailError
from durable_assets.kit import Intent


def acct(legacy_id: str, credit_cents: int, currency: str = "usd") -> dict[str, Any]:
    """One row of a *valid* accounts frame (what validation produces)."""
    return {
        s.ROW_NUMBER: 0,
        s.LEGACY_ACCOUNT_ID: legacy_id,
        s.EMAIL: f"{legacy_id.lower()}@example.com",
        s.NAME: legacy_id,
        s.CURRENCY: currency,
        "credit_cents": credit_cents,
        s.UPDATED_AT: pd.Timestamp("2026-10-01T00:00:00Z"),
    }


def accounts(*rows: dict[str, Any]) -> pd.DataFrame:
    df = pd.DataFrame(list(rows), columns=list(s.ACCOUNT_DTYPES))
    df[s.ROW_NUMBER] = np.arange(1, len(df) + 1)
    df[s.UPDATED_AT] = pd.to_datetime(df[s.UPDATED_AT], utc=True)
    return df.astype(s.ACCOUNT_DTYPES)


def cust(legacy_id: str, *, held: str = "") -> dict[str, Any]:
    """Step 3's row for an account: ready with customer ``cus_<id>``, or held with a note."""
    return {
        s.LEGACY_ACCOUNT_ID: legacy_id,
        "customer_id": "" if held else f"cus_{legacy_id}",
        "idempotency_key": f"customer-{legacy_id}",
        "status": CustomerOutcome.HELD_FOR_REVIEW.value if held else CustomerOutcome.READY.value,
        "review_note": held,
    }


def customers(*rows: dict[str, Any]) -> pd.DataFrame:
    return pd.DataFrame(list(rows), columns=list(s.CUSTOMER_DTYPES)).astype(s.CUSTOMER_DTYPES)


def bal(
    legacy_id: str,
    cents: int = 0,
    currency: str = "",
    version: str = "",
    *,
    left: int = 0,
    left_by: str = "",
    missing: bool = False,
) -> dict[str, Any]:
    """What step 4 read for a customer: its balance, the balance's currency ("" for none yet) and
    version; ``left``/``left_by``: what our last adjustment left, where someone moved it since."""
    return {
        "customer_id": f"cus_{legacy_id}",
        "current_cents": cents,
        "current_currency": currency,
        "balance_version": version,
        "migrated_cents": left,
        "migrated_by": left_by,
        "missing": missing,
    }


def balances(*rows: dict[str, Any]) -> pd.DataFrame:
    return pd.DataFrame(list(rows), columns=list(BALANCE_DTYPES))


def plan_of(
    accts: list[dict[str, Any]], custs: list[dict[str, Any]], bals: list[dict[str, Any]]
) -> pd.DataFrame:
    return plan_adjustments(accounts(*accts), customers(*custs), balances(*bals))


def one(plan: pd.DataFrame, legacy_id: str) -> dict[str, Any]:
    rows = plan[plan[s.LEGACY_ACCOUNT_ID] == legacy_id].to_dict("records")
    assert len(rows) == 1, rows
    return {str(k): v for k, v in rows[0].items()}


def _assert_typed(plan: pd.DataFrame) -> None:
    assert list(plan.columns) == list(s.PLAN_DTYPES)
    assert {str(c): str(t) for c, t in plan.dtypes.items()} == {
        c: str(pd.api.types.pandas_dtype(t)) for c, t in s.PLAN_DTYPES.items()
    }


# --- the sign ---------------------------------------------------------------------------------------


def test_target_is_minus_the_credit() -> None:
    out = target_cents(pd.Series([1250, 0, 1], dtype="int64"))
    assert out.tolist() == [-1250, 0, -1] and str(out.dtype) == "int64"


# --- rule 3: already at the target -----------------------------------------------------------------


def test_balance_already_at_target_is_unchanged() -> None:
    plan = plan_of([acct("A", 1250)], [cust("A")], [bal("A", -1250, "usd", "cbtxn_1")])
    row = one(plan, "A")
    assert row["action"] == PlannedAction.UNCHANGED
    assert row["adjustment_cents"] == 0
    assert row["target_cents"] == -1250 and row["current_cents"] == -1250
    assert row["balance_version"] == "cbtxn_1" and row["review_note"] == ""
    _assert_typed(plan)


def test_zero_credit_on_a_new_customer_is_unchanged_not_a_zero_transaction() -> None:
    plan = plan_of([acct("A", 0)], [cust("A")], [bal("A")])
    row = one(plan, "A")
    assert row["action"] == PlannedAction.UNCHANGED and row["adjustment_cents"] == 0


# --- rule 4: one adjustment of exactly the difference ----------------------------------------------


@pytest.mark.parametrize(
    ("credit", "current", "currency", "adjustment"),
    [
        (1250, 0, "", -1250),  # a new customer: the whole credit
        (1250, -500, "usd", -750),  # credit grew
        (1250, -2000, "usd", 750),  # credit shrank: the balance moves back towards zero
        (0, -2000, "usd", 2000),  # credit used up in the legacy system
        (1250, 300, "usd", -1550),  # the customer owed us 3.00
        (1, 0, "usd", -1),  # a balance of zero that already has a currency
    ],
)
def test_one_adjustment_of_exactly_the_difference(
    credit: int, current: int, currency: str, adjustment: int
) -> None:
    plan = plan_of([acct("A", credit)], [cust("A")], [bal("A", current, currency, "cbtxn_9")])
    row = one(plan, "A")
    assert row["action"] == PlannedAction.ADJUST
    assert row["adjustment_cents"] == adjustment
    assert row["current_cents"] + row["adjustment_cents"] == row["target_cents"] == -credit
    assert row["customer_id"] == "cus_A" and row["currency"] == "usd"
    assert row["balance_version"] == "cbtxn_9" and row["review_note"] == ""


# --- rule 1: the customer is held ------------------------------------------------------------------


def test_held_customer_holds_the_account_with_its_note() -> None:
    note = "2 provider customers name this legacy account: ['cus_x', 'cus_y']"
    plan = plan_of([acct("A", 1250), acct("B", 500)], [cust("A", held=note), cust("B")], [bal("B")])
    row = one(plan, "A")
    assert row["action"] == PlannedAction.HELD_FOR_REVIEW
    assert row["adjustment_cents"] == 0 and row["customer_id"] == ""
    assert row["review_note"] == note
    assert one(plan, "B")["action"] == PlannedAction.ADJUST


def test_account_with_no_customer_row_at_all_is_held() -> None:
    plan = plan_of([acct("A", 1250)], [], [])
    row = one(plan, "A")
    assert row["action"] == PlannedAction.HELD_FOR_REVIEW and row["adjustment_cents"] == 0
    assert row["review_note"] == "no provider customer"


# --- rule 2: the balance is in another currency ----------------------------------------------------


@pytest.mark.parametrize("current", [-700, 0, 900])
def test_balance_in_another_currency_is_held_for_a_person(current: int) -> None:
    plan = plan_of([acct("A", 1250, "usd")], [cust("A")], [bal("A", current, "eur", "cbtxn_1")])
    row = one(plan, "A")
    assert row["action"] == PlannedAction.HELD_FOR_REVIEW
    assert row["adjustment_cents"] == 0
    note = row["review_note"]
    assert "cus_A" in note and "EUR" in note and "USD" in note and "by hand" in note


def test_same_amount_in_another_currency_is_not_unchanged() -> None:
    plan = plan_of([acct("A", 1250, "gbp")], [cust("A")], [bal("A", -1250, "chf", "cbtxn_1")])
    assert one(plan, "A")["action"] == PlannedAction.HELD_FOR_REVIEW


# --- balances from the customers list --------------------------------------------------------------


def listed(*rows: tuple[str, int, str]) -> pd.DataFrame:
    """The customers list as step 4 reads it: (legacy ID, balance, balance currency or "")."""
    return pd.DataFrame(
        [{"customer_id": f"cus_{a}", "balance": b, "balance_currency": c} for a, b, c in rows],
        columns=list(LISTED_DTYPES),
    )


def test_only_customers_listed_at_their_target_in_their_currency_are_settled_without_a_read() -> None:
    accts = accounts(
        acct("AT", 1250), acct("ZERO", 0), acct("OFF", 1250), acct("FX", 1250, "eur"), acct("GONE", 10)
    )
    custs = customers(cust("AT"), cust("ZERO"), cust("OFF"), cust("FX"), cust("GONE"), cust("H", held="x"))
    out = balances_at_target(
        accts,
        custs,
        listed(
            ("AT", -1250, "usd"), ("ZERO", 0, ""), ("OFF", -1000, "usd"), ("FX", -1250, "usd"), ("H", 0, "")
        ),
    )
    # OFF (another balance), FX (another currency), GONE (not listed) and the held H are read or skipped.
    assert out["customer_id"].tolist() == ["cus_AT", "cus_ZERO"]
    assert out["current_cents"].tolist() == [-1250, 0]
    assert out["current_currency"].tolist() == ["usd", ""]
    assert out["balance_version"].tolist() == ["", ""]
    assert list(out.columns) == list(BALANCE_DTYPES)


def test_a_settled_balance_plans_as_if_its_transaction_had_been_read() -> None:
    """Rule 3 gives the same answer from the list as from the newest transaction: unchanged."""
    accts, custs = accounts(acct("A", 1250), acct("B", 0)), customers(cust("A"), cust("B"))
    settled = balances_at_target(accts, custs, listed(("A", -1250, "usd"), ("B", 0, "")))
    from_list = plan_adjustments(accts, custs, settled)
    from_reads = plan_adjustments(accts, custs, balances(bal("A", -1250, "usd", "cbtxn_1"), bal("B")))
    assert from_list["action"].tolist() == from_reads["action"].tolist() == ["unchanged", "unchanged"]
    assert from_list["adjustment_cents"].tolist() == from_reads["adjustment_cents"].tolist() == [0, 0]


def test_a_customer_listed_with_no_currency_is_settled_at_zero_with_no_version_whatever_its_target() -> None:
    """No currency: no balance transaction was ever applied, so reading the newest one would answer
    none; the plan is the one those reads would give."""
    accts = accounts(acct("NEW", 1250), acct("OLD", 1250), acct("ODD", 1250))
    custs = customers(cust("NEW"), cust("OLD"), cust("ODD"), cust("H", held="x"))
    seen = listed(("NEW", 0, ""), ("OLD", -1000, "usd"), ("ODD", 500, ""), ("H", 0, ""))
    out = balances_never_moved(custs, seen)
    # OLD has moved (a currency), ODD has a balance without one (read to be sure), H is held.
    assert out["customer_id"].tolist() == ["cus_NEW"]
    assert (out["current_cents"].tolist(), out["current_currency"].tolist()) == ([0], [""])
    assert out["balance_version"].tolist() == [""]
    from_list = plan_adjustments(accts, custs, out)
    from_read = plan_adjustments(accts, custs, balances(bal("NEW")))
    new = from_list[from_list["legacy_account_id"] == "NEW"]
    assert new.equals(from_read[from_read["legacy_account_id"] == "NEW"])
    assert new["adjustment_cents"].tolist() == [-1250]


def test_nothing_listed_settles_nothing() -> None:
    out = balances_at_target(accounts(acct("A", 100)), customers(cust("A")), listed())
    assert out.empty and list(out.columns) == list(BALANCE_DTYPES)


# --- the frame as a whole --------------------------------------------------------------------------


def test_a_balance_moved_by_hand_after_our_adjustment_is_held_with_both_figures_not_reverted() -> None:
    """+300 added by hand after the migration left -1000: the export did not change, so the plan
    would post -300; instead the account is held and the note gives both figures."""
    plan = plan_adjustments(
        accounts(acct("A", 1000), acct("B", 1000)),
        customers(cust("A"), cust("B")),
        balances(
            bal("A", -700, "usd", "txn_hand", left=-1000, left_by="txn_ours"),
            bal("B", -500, "usd", "txn_b"),  # never migrated by us: adjusted to the target as before
        ),
    )
    a, b = plan.iloc[0], plan.iloc[1]
    assert a["action"] == PlannedAction.HELD_FOR_REVIEW and a["adjustment_cents"] == 0
    assert "changed at the provider outside this migration" in a["review_note"]
    assert "-7.00 USD" in a["review_note"] and "-10.00 USD" in a["review_note"], a["review_note"]
    assert "txn_ours" in a["review_note"] and "the export has not changed since" in a["review_note"]
    assert b["action"] == PlannedAction.ADJUST and b["adjustment_cents"] == -500


def test_a_balance_moved_by_hand_is_held_too_when_the_export_changed() -> None:
    plan = plan_adjustments(
        accounts(acct("A", 2000)),
        customers(cust("A")),
        balances(bal("A", -700, "usd", "txn_hand", left=-1000, left_by="txn_ours")),
    )
    assert plan.iloc[0]["action"] == PlannedAction.HELD_FOR_REVIEW
    assert "the export's target is now -20.00 USD" in plan.iloc[0]["review_note"]


def test_a_customer_deleted_after_step_3_found_it_holds_its_account_alone() -> None:
    plan = plan_adjustments(
        accounts(acct("A", 1000), acct("B", 1000)),
        customers(cust("A"), cust("B")),
        balances(bal("A", missing=True), bal("B")),
    )
    a, b = plan.iloc[0], plan.iloc[1]
    assert a["action"] == PlannedAction.HELD_FOR_REVIEW and a["adjustment_cents"] == 0
    assert (
        "cus_A, which legacy account A is migrated to, was deleted at the provider after this batch found it"
        in (a["review_note"])
    )
    assert b["action"] == PlannedAction.ADJUST


def test_a_balance_moved_by_hand_back_to_the_target_needs_nothing() -> None:
    plan = plan_adjustments(
        accounts(acct("A", 1000)),
        customers(cust("A")),
        balances(bal("A", -1000, "usd", "txn_hand", left=-700, left_by="txn_ours")),
    )
    assert plan.iloc[0]["action"] == PlannedAction.UNCHANGED


def test_every_account_gets_one_row_in_the_accounts_order() -> None:
    plan = plan_of(
        [acct("C", 100), acct("A", 200, "eur"), acct("B", 300), acct("D", 400)],
        [cust("A"), cust("B", held="held"), cust("C"), cust("D")],
        [bal("D", -400, "usd", "v_d"), bal("A", -50, "eur", "v_a"), bal("C")],
    )
    assert plan[s.LEGACY_ACCOUNT_ID].tolist() == ["C", "A", "B", "D"]
    assert plan["action"].tolist() == ["adjust", "adjust", "held_for_review", "unchanged"]
    assert plan["adjustment_cents"].tolist() == [-100, -150, 0, 0]
    assert plan["balance_version"].tolist() == ["", "v_a", "", "v_d"]
    _assert_typed(plan)


def test_zero_rows_give_an_empty_typed_plan() -> None:
    plan = plan_of([], [], [])
    assert plan.empty
    _assert_typed(plan)


def test_zero_rows_of_balances_with_every_customer_held() -> None:
    plan = plan_of([acct("A", 1)], [cust("A", held="x")], [])
    assert plan["action"].tolist() == ["held_for_review"]
    _assert_typed(plan)


# --- per-batch ceilings (step 5's guard, before any request) ---------------------------------------


def adjustments(*rows: tuple[str, int]) -> pd.DataFrame:
    """Planned adjustments: (currency, adjustment_cents)."""
    return pd.DataFrame(
        {
            s.LEGACY_ACCOUNT_ID: [f"A{i}" for i in range(len(rows))],
            s.CURRENCY: [c for c, _ in rows],
            "adjustment_cents": pd.Series([a for _, a in rows], dtype="int64"),
        }
    )


def test_ceiling_on_the_number_of_adjustments() -> None:
    three = adjustments(("usd", -1), ("usd", -1), ("eur", -1))
    enforce_credit_limits(three, CreditLimits(max_adjustments_per_batch=3))  # at the ceiling: fine
    with pytest.raises(CreditCeilingExceededError) as info:
        enforce_credit_limits(three, CreditLimits(max_adjustments_per_batch=2))
    message = str(info.value)
    assert "3 balance adjustments exceed the per-batch ceiling of 2" in message
    assert "DURABLE_MAX_CREDIT_ADJUSTMENTS_PER_BATCH" in message and "no balance was moved" in message
    assert isinstance(info.value, GuardrailError)


def test_ceiling_on_credit_counts_absolute_values_per_currency() -> None:
    # -600 and +500 net to -100, but move 11.00 of credit: the ceiling counts what moves.
    mixed = adjustments(("usd", -600), ("usd", 500), ("eur", -1000), ("gbp", 1000))
    enforce_credit_limits(mixed, CreditLimits(max_credit_per_batch_cents=1100))
    with pytest.raises(CreditCeilingExceededError) as info:
        enforce_credit_limits(mixed, CreditLimits(max_credit_per_batch_cents=1099))
    message = str(info.value)
    assert "11.00 USD" in message and "10.99 USD" in message
    assert "DURABLE_MAX_CREDIT_PER_BATCH_CENTS" in message and "at least 1100" in message


def test_no_adjustments_pass_any_ceiling() -> None:
    enforce_credit_limits(
        adjustments(), CreditLimits(max_adjustments_per_batch=0, max_credit_per_batch_cents=0)
    )


# --- what counts as the transaction we asked for ---------------------------------------------------


def test_an_answer_that_is_not_the_requested_transaction_is_not_trusted() -> None:
    intent = Intent("credit-x", {"customer_id": "cus_1", "amount": -1250, "currency": "usd"})
    good = {"id": "cbtxn_1", "customer": "cus_1", "amount": -1250, "currency": "usd", "ending_balance": -1250}
    assert verify_adjustment(intent, good) is None
    problem = verify_adjustment(intent, {**good, "amount": -125, "currency": "eur"})
    assert problem is not None and "amount -125 != requested -1250" in problem and "currency" in problem
    assert verify_adjustment(intent, {**good, "customer": "cus_2"}) is not None


def test_a_persons_decisions_come_before_the_rules_and_move_nothing() -> None:
    """Kept: a hand-moved balance (rule 4) and an ordinary difference (rule 5) are left as the
    provider holds them, with both figures; a balance already at its target stays "unchanged".
    No customer: step 3's decided row is decided in the plan too, with its note."""
    decided = {
        **cust("D"),
        "status": CustomerOutcome.DECIDED_BY_PERSON.value,
        "review_note": "no customer: ann",
    }
    plan = plan_adjustments(
        accounts(acct("A", 1000), acct("B", 1000), acct("C", 1000), acct("D", 1000)),
        customers(cust("A"), cust("B"), cust("C"), {**decided, "customer_id": ""}),
        balances(
            bal("A", -700, "usd", "txn_hand", left=-1000, left_by="txn_ours"),
            bal("B", -500, "usd", "txn_b"),
            bal("C", -1000, "usd", "txn_c"),
        ),
        kept={"A": "ann decided keep-provider-balance: goodwill", "B": "bob decided", "C": "cy decided"},
    )
    a, b, c, d = (one(plan, x) for x in "ABCD")
    assert a["action"] == b["action"] == d["action"] == PlannedAction.DECIDED_BY_PERSON
    assert a["adjustment_cents"] == b["adjustment_cents"] == d["adjustment_cents"] == 0
    assert a["review_note"] == (
        "customer cus_A's balance -7.00 USD kept at the provider (target -10.00 USD): "
        "ann decided keep-provider-balance: goodwill"
    )
    assert c["action"] == PlannedAction.UNCHANGED
    assert d["review_note"] == "no customer: ann"
