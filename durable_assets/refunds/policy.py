"""The refund policy: which validated invoices deserve a refund, of how much, and why.

This module is *pure* — a function of the valid frame alone, no clock, no randomness, no I/O — so that
re-running a crashed batch recomputes exactly the same candidates (and therefore the same idempotency
keys), and so that the policy can be tested exhaustively on tiny hand-made frames.

Rules (one reason per invoice; earlier rules win):

1. ``duplicate_charge`` — among invoices with the same ``(customer_id, service_period, currency)``, the
   one charged first is the original (ties on ``charged_at``: the smallest ``invoice_id`` in plain
   string order); every other one is refunded in full, i.e. its whole refundable amount.
   *Example:* C1 is charged 20.00 usd for 2026-10 by INV-A at 10:00 and by INV-B at 10:05 → INV-B gets
   a 20.00 refund; INV-A none.
2. ``charged_after_cancellation`` — ``cancelled_at`` is set and ``charged_at`` is strictly later →
   refunded in full. *Example:* cancelled 2026-10-15T00:00Z, charged 2026-11-01T00:00Z for 30.00 →
   30.00 refund. Charged at exactly the cancellation instant is *not* after: no refund.
3. ``overcharge`` — ``amount_charged > contracted_amount`` → the difference. *Example:* charged 12.00,
   contract 10.00 → 2.00 refund; charged 10.01 vs 10.00 → 0.01.

For every rule the refund is capped by what is still refundable:
``refundable = amount_charged - already_refunded`` and ``refund = min(rule amount, refundable)``.
*Example:* overcharged by 2.00 on a 12.00 charge of which 11.00 was already refunded → refund 1.00.
An invoice whose refund would be 0 (e.g. already fully refunded) is not a candidate at all, and it
does not fall through to a lower-precedence rule (every rule is capped by the same refundable amount).
"""

from __future__ import annotations

from typing import Any, Final

import numpy as np
import pandas as pd

from durable_assets.refunds import schema as s
from durable_assets.refunds.schema import RefundReason

__all__ = ["compute_refund_candidates", "summarize"]

REASON: Final = "reason"
REFUND_CENTS: Final = "refund_cents"
REFUNDABLE_CENTS: Final = "refundable_cents"
EXPLANATION: Final = "explanation"

#: Reasons in precedence order; the index is the code used internally.
_PRECEDENCE: Final[tuple[RefundReason, ...]] = tuple(RefundReason)
#: Each rule's code, by name: what ``np.select`` picks and the explanations branch on.
_DUPLICATE: Final = _PRECEDENCE.index(RefundReason.DUPLICATE_CHARGE)
_AFTER_CANCELLATION: Final = _PRECEDENCE.index(RefundReason.CHARGED_AFTER_CANCELLATION)
_OVERCHARGE: Final = _PRECEDENCE.index(RefundReason.OVERCHARGE)
_NO_RULE: Final = -1

_NEEDED_COLUMNS: Final = (
    s.INVOICE_ID,
    s.CUSTOMER_ID,
    s.CUSTOMER_EMAIL,
    s.CHARGE_ID,
    s.CURRENCY,
    s.AMOUNT_CHARGED_CENTS,
    s.CONTRACTED_CENTS,
    s.ALREADY_REFUNDED_CENTS,
    s.SERVICE_PERIOD,
    s.CHARGED_AT,
    s.CANCELLED_AT,
)


def _empty_candidates() -> pd.DataFrame:
    return pd.DataFrame({c: pd.Series([], dtype=d) for c, d in s.CANDIDATE_DTYPES.items()})


def _money(cents: np.ndarray) -> pd.Series:
    """Non-negative integer cents as "12.34" text, vectorised (no float round trip)."""
    series = pd.Series(cents, dtype="int64")
    return (series // 100).astype("str") + "." + (series % 100).astype("str").str.zfill(2)


def _iso_seconds(ts: pd.Series) -> pd.Series:
    """UTC timestamps as ``2026-10-01T10:00:00Z`` (seconds precision, enough for an explanation)."""
    naive = ts.dt.tz_convert("UTC").dt.tz_localize(None).to_numpy(dtype="datetime64[s]")
    return pd.Series(np.datetime_as_string(naive, unit="s"), dtype="str") + "Z"


def compute_refund_candidates(valid: pd.DataFrame) -> pd.DataFrame:
    """Apply the refund policy (see the module docstring) to a *validated* invoice frame.

    Input: ``ValidationResult.valid`` (columns of :data:`schema.VALID_DTYPES`; only valid rows, so a
    quarantined invoice can never be refunded). Dropping rows only ever removes refunds: a quarantined
    "original" makes the next charge the original, which is a refund we would not issue anyway.

    Returns one row per candidate, sorted by ``invoice_id``, columns ``invoice_id, customer_id,
    customer_email, charge_id, currency, reason, refund_cents (int64), refundable_cents (int64),
    explanation`` where ``explanation`` is a one-line human-readable justification.

    Raises ``ValueError`` if required columns are missing or ``invoice_id`` is not unique: the output
    (and the idempotency keys built from it) is keyed by invoice, so ambiguity here must stop the run.
    """
    missing = [c for c in _NEEDED_COLUMNS if c not in valid.columns]
    if missing:
        raise ValueError(f"valid invoice frame lacks columns: {', '.join(missing)}")
    if len(valid) == 0:
        return _empty_candidates()
    frame = valid.reset_index(drop=True)
    invoice_id = frame[s.INVOICE_ID].astype("str")
    if invoice_id.duplicated().any():
        dupes = sorted(invoice_id[invoice_id.duplicated()].unique().tolist())[:5]
        raise ValueError(f"invoice_id must be unique in the valid frame; duplicated: {', '.join(dupes)}")

    charged = frame[s.AMOUNT_CHARGED_CENTS].to_numpy(dtype=np.int64)
    contracted = frame[s.CONTRACTED_CENTS].to_numpy(dtype=np.int64)
    already = frame[s.ALREADY_REFUNDED_CENTS].to_numpy(dtype=np.int64)
    # Validation guarantees 0 <= already <= charged; clip anyway so a hand-built frame can never
    # produce a negative "refund".
    refundable = np.maximum(charged - already, 0)

    # Rule 1: order rows by (group, charged_at, invoice_id); the first row of each group is the original.
    group = (
        frame.groupby([s.CUSTOMER_ID, s.SERVICE_PERIOD, s.CURRENCY], sort=False, dropna=False)
        .ngroup()
        .to_numpy(dtype=np.int64)
    )
    invoice_rank = pd.factorize(invoice_id, sort=True)[0]  # lexicographic rank, unique per row
    charged_at_i8 = pd.DatetimeIndex(frame[s.CHARGED_AT]).asi8
    order = np.lexsort((invoice_rank, charged_at_i8, group))
    sorted_group = group[order]
    starts = np.ones(len(order), dtype=bool)
    starts[1:] = sorted_group[1:] != sorted_group[:-1]
    is_duplicate = np.empty(len(order), dtype=bool)
    is_duplicate[order] = ~starts
    first_in_sorted = np.maximum.accumulate(np.where(starts, np.arange(len(order)), 0))
    original_pos = np.empty(len(order), dtype=np.int64)
    original_pos[order] = order[first_in_sorted]

    # Rule 2: strictly after; NaT (never cancelled) compares False.
    cancelled_at = frame[s.CANCELLED_AT]
    after_cancel = (cancelled_at.notna() & (frame[s.CHARGED_AT] > cancelled_at)).to_numpy(dtype=bool)

    # Rule 3.
    overcharged = charged > contracted

    conditions = [is_duplicate, after_cancel, overcharged]  # in precedence order: the first true wins
    reason_code = np.select(conditions, [_DUPLICATE, _AFTER_CANCELLATION, _OVERCHARGE], default=_NO_RULE)
    rule_amount = np.select(conditions, [refundable, charged, charged - contracted], default=0)
    refund = np.minimum(rule_amount, refundable)
    selected = np.flatnonzero((reason_code != _NO_RULE) & (refund > 0))
    if len(selected) == 0:
        return _empty_candidates()
    selected = selected[np.argsort(invoice_rank[selected], kind="stable")]

    sub = frame.iloc[selected].reset_index(drop=True)
    codes = reason_code[selected]
    refund_sel = refund[selected]
    refundable_sel = refundable[selected]
    currency = sub[s.CURRENCY].astype("str").str.upper()
    # Every explanation says why (by its rule), then what is refunded of what was refundable.
    refund_txt = "; refund " + _money(refund_sel) + " " + currency
    refundable_txt = " (refundable " + _money(refundable_sel) + " " + currency + ")"

    why = pd.Series([""] * len(selected), dtype="str")
    dup = codes == _DUPLICATE
    if dup.any():
        orig = frame.iloc[original_pos[selected[dup]]].reset_index(drop=True)
        d = sub[dup].reset_index(drop=True)
        why[dup] = (
            "duplicate charge: "
            + orig[s.INVOICE_ID].astype("str")
            + " (charged "
            + _iso_seconds(orig[s.CHARGED_AT])
            + ") already bills customer "
            + d[s.CUSTOMER_ID].astype("str")
            + " for "
            + d[s.SERVICE_PERIOD].astype("str")
            + " in "
            + currency[dup].reset_index(drop=True)
        ).to_numpy()
    canc = codes == _AFTER_CANCELLATION
    if canc.any():
        c = sub[canc].reset_index(drop=True)
        why[canc] = (
            "charged "
            + _iso_seconds(c[s.CHARGED_AT])
            + " after the subscription was cancelled "
            + _iso_seconds(c[s.CANCELLED_AT])
        ).to_numpy()
    over = codes == _OVERCHARGE
    if over.any():
        o = sub[over].reset_index(drop=True)
        cur = currency[over].reset_index(drop=True)
        why[over] = (
            "charged "
            + _money(o[s.AMOUNT_CHARGED_CENTS].to_numpy())
            + " "
            + cur
            + " but the contract says "
            + _money(o[s.CONTRACTED_CENTS].to_numpy())
            + " "
            + cur
        ).to_numpy()
    explanation = why + refund_txt + refundable_txt

    reasons = np.array([r.value for r in _PRECEDENCE], dtype=object)[codes]
    out = pd.DataFrame(
        {
            s.INVOICE_ID: sub[s.INVOICE_ID],
            s.CUSTOMER_ID: sub[s.CUSTOMER_ID],
            s.CUSTOMER_EMAIL: sub[s.CUSTOMER_EMAIL],
            s.CHARGE_ID: sub[s.CHARGE_ID],
            s.CURRENCY: sub[s.CURRENCY],
            REASON: reasons,
            REFUND_CENTS: refund_sel,
            REFUNDABLE_CENTS: refundable_sel,
            EXPLANATION: explanation,
        }
    )
    return out.astype(s.CANDIDATE_DTYPES)


def summarize(candidates: pd.DataFrame) -> dict[str, Any]:
    """Counts and cents of a candidates frame, as plain JSON-able values for run metadata.

    Cents are only ever summed *within* a currency: a total across currencies is meaningless, so there
    is none. Every reason appears (with zeros) so dashboards see a stable shape; currencies appear only
    when present. Shape::

        {"count": 3,
         "by_reason": {"duplicate_charge": {"count": 1, "refund_cents": {"usd": 2000}}, ...},
         "by_currency": {"usd": {"count": 2, "refund_cents": 2500}, ...},
         "by_reason_and_currency": {"duplicate_charge": {"usd": {"count": 1, "refund_cents": 2000}}, ...}}
    """
    by_reason: dict[str, dict[str, Any]] = {r.value: {"count": 0, "refund_cents": {}} for r in _PRECEDENCE}
    by_currency: dict[str, dict[str, int]] = {}
    by_both: dict[str, dict[str, dict[str, int]]] = {r.value: {} for r in _PRECEDENCE}
    if len(candidates):
        grouped = (
            candidates.groupby([REASON, s.CURRENCY], sort=True)[REFUND_CENTS]
            .agg(["count", "sum"])
            .reset_index()
        )
        for reason, currency, count, cents in grouped.itertuples(index=False, name=None):
            reason, currency, count, cents = str(reason), str(currency), int(count), int(cents)
            entry = by_reason.setdefault(reason, {"count": 0, "refund_cents": {}})
            entry["count"] += count
            entry["refund_cents"][currency] = entry["refund_cents"].get(currency, 0) + cents
            cur = by_currency.setdefault(currency, {"count": 0, "refund_cents": 0})
            cur["count"] += count
            cur["refund_cents"] += cents
            by_both.setdefault(reason, {})[currency] = {"count": count, "refund_cents": cents}
    return {
        "count": len(candidates),
        "by_reason": by_reason,
        "by_currency": dict(sorted(by_currency.items())),
        "by_reason_and_currency": by_both,
    }
