"""The report is the provider's truth, both ways (#33 item 4): what the provider holds for a
batch's accounts is accounted for in the report, not only what the report says was made.

The rules as pure functions of frames, without a provider; ``test_pipeline.py`` runs them against
the embedded provider (a customer made by hand for a held account, a transaction under a held key).
"""

from __future__ import annotations

from collections.abc import Hashable
from typing import Any

import pandas as pd

from durable_assets import kit
from durable_assets.credit_migration import schema as s
from durable_assets.credit_migration.assets import _applied_frame
from durable_assets.credit_migration.checks import customer_changes
from durable_assets.credit_migration.plan import naming_every_customer


def _customers(*rows: tuple[str, str, str, str]) -> pd.DataFrame:
    """Step 3's frame from (account, customer id, status, note)."""
    frame = pd.DataFrame(
        [
            {
                s.LEGACY_ACCOUNT_ID: acct,
                "customer_id": cid,
                "idempotency_key": f"customer:{acct}",
                "status": status,
                "review_note": note,
            }
            for acct, cid, status, note in rows
        ],
        columns=list(s.CUSTOMER_DTYPES),
    )
    return kit.tables.typed(frame, s.CUSTOMER_DTYPES)


def test_a_customer_made_for_a_held_account_since_step_3_is_counted_not_a_problem() -> None:
    """Step 4 names it in the held row's note (#34: a hand-made customer no longer fails the batch)."""
    rows = _customers(
        ("A", "cus_1", "ready", ""),
        ("B", "", "held_for_review", "2 provider customers name legacy account B: cus_2, cus_3; keep one"),
        ("C", "", "held_for_review", "the provider refused the request: email invalid (code x)"),
        (
            "D",
            "",
            "held_for_review",
            "customer cus_4 was deleted at the provider; provider customers naming it now: cus_5",
        ),
    )
    at_provider = {"A": ["cus_1"], "B": ["cus_2", "cus_3", "cus_33"], "C": ["cus_9"], "D": ["cus_5"]}
    problems, changes = customer_changes(rows, at_provider)
    assert problems == [] and changes == {"made_for_held": 2}  # cus_3 named does not name cus_33


def test_a_ready_account_changed_at_the_provider_is_counted_by_kind() -> None:
    rows = _customers(
        ("A", "cus_1", "ready", ""),
        ("E", "cus_7", "ready", ""),
        ("F", "cus_8", "ready", ""),
        ("G", "cus_9", "ready", ""),
    )
    read = {"cus_7": (True, ""), "cus_8": (False, "F-old")}
    problems, changes = customer_changes(rows, {"A": ["cus_1", "cus_2"], "G": ["cus_9"]}, read)
    assert problems == []
    assert changes == {"duplicated": 1, "deleted": 1, "relabelled": 1}


def test_a_recorded_customer_the_list_leaves_out_is_a_problem() -> None:
    """Read by id it still names its account, yet the provider's list does not show it: the list
    cannot be trusted, which is no one account's problem."""
    rows = _customers(("E", "cus_7", "ready", ""))
    problems, _ = customer_changes(rows, {}, {"cus_7": (False, "E")})
    assert problems == [
        "E: customer cus_7 names the account but the provider's list of its customers shows []"
    ]
    problems, _ = customer_changes(rows, {})  # not read at all
    assert problems == ["E: provider customers [], we recorded cus_7"]


def test_zero_rows_have_no_problem_whatever_the_provider_holds() -> None:
    assert customer_changes(_customers(), {"A": ["cus_1"]}) == ([], {})


def test_a_held_note_from_the_ledger_names_customers_made_since() -> None:
    """A refusal recorded on an earlier night knows nothing of a customer made by hand since."""
    refused = "the provider refused the request: email invalid"
    note = naming_every_customer("C", refused, ["cus_9"])
    assert note == f"{refused}; provider customers naming legacy account C now: cus_9"
    assert naming_every_customer("C", note, ["cus_9"]) == note  # named: unchanged
    assert naming_every_customer("C", refused, []) == refused


def _plan(acct: str, customer_id: str) -> pd.DataFrame:
    frame = pd.DataFrame(
        [
            {
                s.LEGACY_ACCOUNT_ID: acct,
                "customer_id": customer_id,
                s.CURRENCY: "usd",
                "target_cents": -1000,
                "current_cents": 0,
                "balance_version": "",
                "adjustment_cents": -1000,
                "action": "adjust",
                "review_note": "",
            }
        ],
        columns=list(s.PLAN_DTYPES),
    )
    return kit.tables.typed(frame, s.PLAN_DTYPES)


def _held(review: dict[str, Any]) -> dict[Hashable, Any]:
    intent = kit.Intent("adjust:A", {s.LEGACY_ACCOUNT_ID: "A", "customer_id": "cus_1"})
    [row] = _applied_frame(
        _plan("A", "cus_1"), [intent], kit.EffectReport(review={"adjust:A": review})
    ).to_dict("records")
    assert row["status"] == "held_for_review" and row["idempotency_key"] == "adjust:A"
    return row


def test_a_held_answer_names_the_transaction_that_exists_at_the_provider() -> None:
    """The provider answered the key with a transaction that is not what was asked: it exists, so the
    row carries its id and says so, never reads as if no money moved."""
    row = _held({"mismatch": "amount -500 != -1000", "provider_answer": {"id": "cbtxn_1", "amount": -500}})
    assert row["transaction_id"] == "cbtxn_1"
    assert row["review_note"].startswith("provider answer does not match the request: amount -500 != -1000")
    assert "balance transaction cbtxn_1 exists at the provider" in row["review_note"]
    assert "not counted as applied" in row["review_note"]


def test_a_held_row_without_an_answer_claims_no_transaction() -> None:
    """A refusal, or a balance another key claimed first (whose transaction is that key's row's):
    the ledger knows of no transaction under this key, and the row names none."""
    refused = _held({"error": "No such customer: 'cus_1'", "code": "resource_missing", "http_status": 404})
    taken = _held(
        {
            "subject_taken": "balance:cus_1:",
            "holder_key": "adjust:other",
            "holder_params": {"target": -2000},
            "holder_state": "finished",
            "holder_result_id": "cbtxn_other",
        }
    )
    for row in (refused, taken):
        assert row["transaction_id"] == "" and "exists at the provider" not in row["review_note"]
    assert "was deleted at the provider after this batch planned its adjustment" in refused["review_note"]
    assert "nothing was moved" in refused["review_note"]


def test_an_old_intent_whose_customer_was_deleted_is_held_as_unknown_never_sent() -> None:
    """A lookup (the intent older than the provider's key retention) found the customer deleted:
    whether the first request reached it cannot be known any more, and the note says so."""
    row = _held({"mismatch": "customer cus_1 was deleted", "provider_answer": {"customer_deleted": "cus_1"}})
    assert row["transaction_id"] == ""
    assert "was deleted at the provider before this adjustment's answer was recorded" in row["review_note"]
    assert "not sent again" in row["review_note"]
