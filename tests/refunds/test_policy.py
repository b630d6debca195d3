"""The refund policy on small hand-made frames: each rule, its boundaries, precedence and caps."""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd
import pytest

from durable_assets.refunds import schema as s
from durable_assets.refunds.policy import compute_refund_candidates, summarize


def inv(
    invoice_id: str,
    *,
    customer: str = "C1",
    period: str = "2026-10",
    currency: str = "usd",
    charged: int = 1000,
    contracted: int | None = None,
    refunded: int = 0,
    charged_at: str = "2026-10-01T10:00:00Z",
    cancelled_at: str | None = None,
) -> dict[str, Any]:
    """One row of a *valid* frame (what validation produces); by default nothing is wrong with it."""
    return {
        s.ROW_NUMBER: 0,
        s.INVOICE_ID: invoice_id,
        s.CUSTOMER_ID: customer,
        s.CUSTOMER_EMAIL: f"{customer.lower()}@example.com",
        s.CHARGE_ID: f"ch_{invoice_id}",
        s.CURRENCY: currency,
        s.AMOUNT_CHARGED_CENTS: charged,
        s.CONTRACTED_CENTS: charged if contracted is None else contracted,
        s.ALREADY_REFUNDED_CENTS: refunded,
        s.SERVICE_PERIOD: period,
        s.CHARGED_AT: pd.Timestamp(charged_at),
        s.CANCELLED_AT: pd.Timestamp(cancelled_at) if cancelled_at else pd.NaT,
    }


def valid(*rows: dict[str, Any]) -> pd.DataFrame:
    df = pd.DataFrame(list(rows), columns=list(s.VALID_COLUMNS))
    df[s.ROW_NUMBER] = np.arange(1, len(df) + 1)
    for col in (s.CHARGED_AT, s.CANCELLED_AT):
        df[col] = pd.to_datetime(df[col], utc=True)
    return df.astype(s.VALID_DTYPES)


def refunds(*rows: dict[str, Any]) -> dict[str, tuple[str, int]]:
    """invoice_id -> (reason, refund_cents) for every candidate."""
    out = compute_refund_candidates(valid(*rows))
    return {
        str(inv_id): (str(reason), int(cents))
        for inv_id, reason, cents in zip(out["invoice_id"], out["reason"], out["refund_cents"], strict=True)
    }


# --- nothing to refund -----------------------------------------------------------------------------


def test_clean_invoices_give_an_empty_typed_frame() -> None:
    out = compute_refund_candidates(valid(inv("A"), inv("B", customer="C2")))
    assert out.empty
    assert list(out.columns) == list(s.CANDIDATE_COLUMNS)
    assert str(out["refund_cents"].dtype) == "int64"


def test_empty_input_gives_an_empty_typed_frame() -> None:
    out = compute_refund_candidates(valid())
    assert list(out.columns) == list(s.CANDIDATE_COLUMNS)
    assert out.empty


# --- rule 1: duplicate charge ----------------------------------------------------------------------


def test_later_charge_for_same_customer_period_currency_is_refunded_in_full() -> None:
    assert refunds(
        inv("A", charged_at="2026-10-01T10:00:00Z"),
        inv("B", charged_at="2026-10-01T10:05:00Z"),
    ) == {"B": ("duplicate_charge", 1000)}


def test_original_is_the_earliest_even_with_a_larger_invoice_id() -> None:
    assert refunds(
        inv("Z", charged_at="2026-10-01T09:00:00Z"),
        inv("A", charged_at="2026-10-01T10:00:00Z"),
    ) == {"A": ("duplicate_charge", 1000)}


def test_tie_on_charged_at_keeps_the_smallest_invoice_id() -> None:
    assert refunds(inv("B"), inv("A"), inv("C")) == {
        "B": ("duplicate_charge", 1000),
        "C": ("duplicate_charge", 1000),
    }


def test_duplicates_do_not_cross_currency_period_or_customer() -> None:
    assert (
        refunds(
            inv("A"),
            inv("B", currency="eur", charged_at="2026-10-02T00:00:00Z"),
            inv("C", period="2026-11", charged_at="2026-10-03T00:00:00Z"),
            inv("D", customer="C2", charged_at="2026-10-04T00:00:00Z"),
        )
        == {}
    )


def test_duplicate_refund_is_capped_by_what_is_still_refundable() -> None:
    assert refunds(inv("A"), inv("B", charged_at="2026-10-02T00:00:00Z", refunded=300)) == {
        "B": ("duplicate_charge", 700)
    }


def test_fully_refunded_duplicate_is_not_a_candidate_and_does_not_fall_through() -> None:
    assert (
        refunds(
            inv("A"),
            inv("B", charged_at="2026-10-02T00:00:00Z", refunded=1000, contracted=500),
        )
        == {}
    )


def test_duplicate_wins_over_cancellation_and_overcharge() -> None:
    out = refunds(
        inv("A", cancelled_at="2026-10-05T00:00:00Z"),
        inv("B", charged_at="2026-10-06T00:00:00Z", cancelled_at="2026-10-05T00:00:00Z", contracted=400),
    )
    assert out == {"B": ("duplicate_charge", 1000)}


def test_duplicate_explanation_names_the_original() -> None:
    out = compute_refund_candidates(valid(inv("A"), inv("B", charged_at="2026-10-02T00:00:00Z")))
    assert out["explanation"].tolist() == [
        "duplicate charge: A (charged 2026-10-01T10:00:00Z) already bills customer C1 for 2026-10 in USD; "
        "refund 10.00 USD (refundable 10.00 USD)"
    ]


# --- rule 2: charged after cancellation ------------------------------------------------------------


def test_charge_after_cancellation_is_refunded_in_full() -> None:
    assert refunds(inv("A", charged=2500, refunded=500, cancelled_at="2026-09-30T00:00:00Z")) == {
        "A": ("charged_after_cancellation", 2000)
    }


def test_charge_at_the_cancellation_instant_is_not_after() -> None:
    assert refunds(inv("A", charged_at="2026-10-01T10:00:00Z", cancelled_at="2026-10-01T10:00:00Z")) == {}


def test_charge_one_microsecond_after_cancellation_is_after() -> None:
    assert refunds(
        inv("A", charged_at="2026-10-01T10:00:00.000001Z", cancelled_at="2026-10-01T10:00:00Z")
    ) == {"A": ("charged_after_cancellation", 1000)}


def test_charge_before_cancellation_or_without_one_is_not_refunded() -> None:
    assert refunds(inv("A", cancelled_at="2026-10-02T00:00:00Z"), inv("B", customer="C2")) == {}


def test_cancellation_wins_over_overcharge() -> None:
    assert refunds(inv("A", charged=1200, contracted=1000, cancelled_at="2026-09-01T00:00:00Z")) == {
        "A": ("charged_after_cancellation", 1200)
    }


# --- rule 3: overcharge ----------------------------------------------------------------------------


def test_overcharge_refunds_the_difference() -> None:
    assert refunds(inv("A", charged=1200, contracted=1000)) == {"A": ("overcharge", 200)}


def test_overcharge_by_exactly_one_cent() -> None:
    assert refunds(inv("A", charged=1001, contracted=1000)) == {"A": ("overcharge", 1)}


def test_charged_exactly_or_less_than_the_contract_is_not_refunded() -> None:
    assert refunds(inv("A", charged=1000, contracted=1000), inv("B", customer="C2", contracted=1500)) == {}


def test_partial_prior_refund_caps_the_overcharge_refund() -> None:
    assert refunds(inv("A", charged=1200, contracted=1000, refunded=1100)) == {"A": ("overcharge", 100)}
    assert refunds(inv("A", charged=1200, contracted=1000, refunded=150)) == {"A": ("overcharge", 200)}


def test_fully_refunded_overcharge_is_not_a_candidate() -> None:
    assert refunds(inv("A", charged=1200, contracted=1000, refunded=1200)) == {}


def test_overcharge_explanation() -> None:
    out = compute_refund_candidates(valid(inv("A", charged=1205, contracted=1000, currency="gbp")))
    assert out["explanation"].tolist() == [
        "charged 12.05 GBP but the contract says 10.00 GBP; refund 2.05 GBP (refundable 12.05 GBP)"
    ]
    assert out["refundable_cents"].tolist() == [1205]


# --- output shape and determinism ------------------------------------------------------------------


MIXED = (
    inv("INV-3", charged=1500, contracted=1000),
    inv("INV-1", customer="C2"),
    inv("INV-10", customer="C2", charged_at="2026-10-02T00:00:00Z"),
    inv("INV-2", customer="C3", cancelled_at="2026-09-01T00:00:00Z", currency="eur"),
    inv("INV-4", customer="C4"),
)


def test_output_columns_dtypes_and_order_by_invoice_id() -> None:
    out = compute_refund_candidates(valid(*MIXED))
    assert list(out.columns) == list(s.CANDIDATE_COLUMNS)
    assert {c: str(t) for c, t in out.dtypes.items()} == {
        c: str(pd.api.types.pandas_dtype(t)) for c, t in s.CANDIDATE_DTYPES.items()
    }
    assert out["invoice_id"].tolist() == ["INV-10", "INV-2", "INV-3"]  # plain string order
    assert out["reason"].tolist() == ["duplicate_charge", "charged_after_cancellation", "overcharge"]
    assert out.index.tolist() == [0, 1, 2]
    row = out.iloc[1]
    assert (row.customer_id, row.customer_email, row.charge_id, row.currency) == (
        "C3",
        "c3@example.com",
        "ch_INV-2",
        "eur",
    )


def test_result_does_not_depend_on_row_order_and_input_is_untouched() -> None:
    df = valid(*MIXED)
    before = df.copy()
    first = compute_refund_candidates(df)
    shuffled = compute_refund_candidates(df.sample(frac=1, random_state=7))
    pd.testing.assert_frame_equal(first, shuffled)
    pd.testing.assert_frame_equal(df, before)


def test_refund_never_exceeds_refundable() -> None:
    rng = np.random.default_rng(0)
    rows = [
        inv(
            f"I{i:03d}",
            customer=f"C{i % 7}",
            period=f"2026-{1 + i % 3:02d}",
            charged=int(rng.integers(0, 3000)),
            contracted=int(rng.integers(0, 3000)),
            charged_at=f"2026-10-0{1 + i % 9}T00:00:00Z",
            cancelled_at="2026-10-04T00:00:00Z" if i % 5 == 0 else None,
        )
        for i in range(200)
    ]
    for row in rows:
        row[s.ALREADY_REFUNDED_CENTS] = int(rng.integers(0, row[s.AMOUNT_CHARGED_CENTS] + 1))
    out = compute_refund_candidates(valid(*rows))
    assert len(out) > 0
    assert (out["refund_cents"] > 0).all()
    assert (out["refund_cents"] <= out["refundable_cents"]).all()


def test_duplicate_invoice_ids_are_refused() -> None:
    with pytest.raises(ValueError, match="invoice_id must be unique"):
        compute_refund_candidates(valid(inv("A"), inv("A", customer="C2")))


def test_missing_columns_are_refused() -> None:
    with pytest.raises(ValueError, match="lacks columns: cancelled_at"):
        compute_refund_candidates(valid(inv("A")).drop(columns=[s.CANCELLED_AT]))


# --- summarize -------------------------------------------------------------------------------------


def test_summarize_counts_and_cents_per_reason_and_currency() -> None:
    summary = summarize(compute_refund_candidates(valid(*MIXED)))
    assert summary == {
        "count": 3,
        "by_reason": {
            "duplicate_charge": {"count": 1, "refund_cents": {"usd": 1000}},
            "charged_after_cancellation": {"count": 1, "refund_cents": {"eur": 1000}},
            "overcharge": {"count": 1, "refund_cents": {"usd": 500}},
        },
        "by_currency": {"eur": {"count": 1, "refund_cents": 1000}, "usd": {"count": 2, "refund_cents": 1500}},
        "by_reason_and_currency": {
            "duplicate_charge": {"usd": {"count": 1, "refund_cents": 1000}},
            "charged_after_cancellation": {"eur": {"count": 1, "refund_cents": 1000}},
            "overcharge": {"usd": {"count": 1, "refund_cents": 500}},
        },
    }
    assert all(type(v["count"]) is int for v in summary["by_currency"].values())


def test_summarize_empty_has_every_reason_with_zero() -> None:
    summary = summarize(compute_refund_candidates(valid()))
    assert summary["count"] == 0
    assert summary["by_reason"] == {r.value: {"count": 0, "refund_cents": {}} for r in s.RefundReason}
    assert summary["by_currency"] == {}
