"""Deterministic synthetic invoices, for demos, load tests and crash tests.

Why deterministic from the batch id alone: a crashed or resumed batch must regenerate *exactly* the
same input, or "exactly once" is meaningless — the re-run would be refunding different invoices. So
the only inputs are ``batch_id`` and ``size``; the generator is seeded from ``sha256(batch_id)`` and no
clock or global random state is touched.

Why invoice ids embed a hash of the batch id: they are business identities, and refund idempotency
keys are derived from them (``keys.refund_key``). Two different batches must therefore never share an
invoice id (or the provider would deduplicate one batch's refund against the other's), while the same
batch id must always produce the same ids. The prefix is the first 10 hex digits (40 bits) of
``sha256(batch_id)``.

The frame is in the *input* string schema (same columns as a file, all text) with an empty
``charge_id``: the pipeline creates the charges on the provider first. The mix is exact, not
probabilistic — see :func:`synthetic_mix` — so tests and dashboards can assert on it:

* ~8% ``duplicate_charge``: a second charge for an existing (customer, period, currency), minutes to
  days after the original, same amount;
* ~6% ``overcharge``: charged 0.01 up to 25% more than the contracted price;
* ~4% ``charged_after_cancellation``: charged hours to days after the customer cancelled;
* ~1% malformed rows that validation quarantines (negative or non-numeric amount, unknown currency,
  bad email, impossible timestamp, refunded > charged, missing customer id, U+FFFD);
* the rest clean: some cancelled *after* being charged, some partially refunded, some with upper-case
  currency codes or naive timestamps — none of which is a refund.

Amounts are 5.00-500.00 in six two-decimal currencies. Everything is vectorised: 1,000,000 rows take
about a second.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from typing import Final, NamedTuple

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

from durable_assets.errors import UsageError
from durable_assets.payments.money import money_text
from durable_assets.refunds import schema as s

__all__ = ["MIX", "batch_prefix", "synthetic_invoices", "synthetic_mix"]

#: Share of rows of each kind. The remainder is clean.
MIX: Final[dict[str, float]] = {
    "duplicate_charge": 0.08,
    "overcharge": 0.06,
    "charged_after_cancellation": 0.04,
    "malformed": 0.01,
}

_CURRENCIES: Final = ("usd", "eur", "gbp", "cad", "aud", "chf")
_CURRENCY_WEIGHTS: Final = np.array([0.55, 0.20, 0.10, 0.06, 0.05, 0.04])
_MIN_CENTS, _MAX_CENTS = 500, 50_000
_DAY = 86_400

# Kinds of primary rows (duplicates are generated from clean ones afterwards).
_CLEAN, _OVER, _CANCEL, _MALFORMED = 0, 1, 2, 3
_N_DEFECTS = 8


def batch_prefix(batch_id: str) -> str:
    """The 10-hex-digit invoice-id prefix of a batch: ``sha256(batch_id)[:10]``."""
    return hashlib.sha256(batch_id.encode("utf-8")).hexdigest()[:10]


def synthetic_mix(size: int) -> dict[str, int]:
    """Exactly how many rows of each kind ``synthetic_invoices(_, size)`` produces.

    Keys are those of :data:`MIX` plus ``"clean"``; values sum to ``size``. ``"malformed"`` is the
    number of rows validation must quarantine; the three refund reasons are exactly the candidate
    counts the policy must find.
    """
    if size < 0:
        raise UsageError(f"--size must be >= 0, got {size}")
    counts = {kind: int(np.floor(size * share + 0.5)) for kind, share in MIX.items()}
    clean = size - sum(counts.values())
    if clean == 0 and counts["duplicate_charge"]:
        # A duplicate needs a clean original; only reachable for absurd shares, kept for safety.
        clean, counts["duplicate_charge"] = counts["duplicate_charge"], 0
    return {**counts, "clean": clean}


def _text(values: pa.Array | pa.ChunkedArray) -> pd.Series:
    """An Arrow string array as a pandas ``str`` Series (zero-copy under pandas 3)."""
    return pd.Series(values.to_pandas(), dtype="str")


def _padded(numbers: np.ndarray, width: int) -> pa.Array:
    return pc.utf8_lpad(pc.cast(pa.array(numbers, pa.int64()), pa.string()), width, "0")


def _ts_text(seconds: np.ndarray, naive: np.ndarray) -> pa.Array:
    """Epoch seconds as ISO 8601, ``2026-10-01T03:04:05Z`` (or without the ``Z`` where ``naive``)."""
    text = pc.cast(pa.array(seconds.astype("datetime64[s]")), pa.string())  # "2026-10-01 03:04:05"
    text = pc.utf8_replace_slice(text, 10, 11, "T")
    return pc.binary_join_element_wise(text, pc.if_else(pa.array(naive), "", "Z"), "")


def synthetic_invoices(batch_id: str, size: int = 1000) -> pd.DataFrame:
    """A deterministic synthetic invoice frame for ``batch_id`` (see the module docstring).

    Same ``batch_id`` and ``size`` → an identical frame; different batch ids → disjoint invoice ids.
    Columns are :data:`schema.INPUT_COLUMNS`, all ``str``; ``charge_id`` is empty, so validate it with
    ``require_charge_id=False``. Invoice ids are ``INV-<batch_prefix>-<n:07d>``, n = 1..size in row order.
    """
    mix = synthetic_mix(size)
    rng = np.random.default_rng(int.from_bytes(hashlib.sha256(batch_id.encode("utf-8")).digest(), "big"))
    prefix = batch_prefix(batch_id)
    n_dup = mix["duplicate_charge"]
    m = size - n_dup  # primary rows

    kind = np.repeat(
        np.array([_CLEAN, _OVER, _CANCEL, _MALFORMED], dtype=np.int8),
        [mix["clean"], mix["overcharge"], mix["charged_after_cancellation"], mix["malformed"]],
    )
    kind = rng.permutation(kind)
    clean = kind == _CLEAN
    cancelled_later = clean & (rng.random(m) < 0.05)
    partially_refunded = clean & ~cancelled_later & (rng.random(m) < 0.03)

    # Customers: most have three consecutive monthly invoices (customer p // 3, month p % 3), so the
    # (customer, period) pairs of primary rows are unique and no accidental duplicate exists. Rows
    # whose customer cancelled get a customer of their own so the customer's cancellation is consistent.
    own_customer = (kind == _CANCEL) | cancelled_later
    positions = np.arange(m, dtype=np.int64)
    customer = np.where(own_customer, m + positions, positions // 3)
    month_offset = np.where(own_customer, rng.integers(0, 3, m), positions % 3)
    base_month = np.datetime64("2026-01", "M") + int(rng.integers(0, 12))
    month = base_month + month_offset
    period_start = month.astype("datetime64[s]").astype(np.int64)
    charged_at = period_start + rng.integers(0, 5 * _DAY, m)

    currency = rng.choice(len(_CURRENCIES), size=m, p=_CURRENCY_WEIGHTS)
    contracted = rng.integers(_MIN_CENTS, _MAX_CENTS + 1, m)
    over = kind == _OVER
    contracted = np.where(over, np.minimum(contracted, _MAX_CENTS * 4 // 5), contracted)
    surcharge = np.maximum(1, (contracted * rng.random(m) * 0.25).astype(np.int64))
    surcharge = np.where(rng.random(m) < 0.1, 1, surcharge)  # some overcharges by exactly one cent
    charged = np.where(over, contracted + surcharge, contracted)
    refunded = np.where(partially_refunded, (charged * rng.uniform(0.1, 0.9, m)).astype(np.int64), 0)

    has_cancel = (kind == _CANCEL) | cancelled_later
    gap = rng.integers(3_600, 20 * _DAY, m)
    cancelled_at = np.where(kind == _CANCEL, charged_at - gap, np.where(cancelled_later, charged_at + gap, 0))

    # Duplicates: copies of clean rows (not cancelled ones, so the cancellation story stays simple),
    # charged 1 minute to 3 days after their original.
    targets = np.flatnonzero(clean & ~cancelled_later)
    if n_dup and len(targets) == 0:  # pragma: no cover - synthetic_mix guarantees a clean row
        raise AssertionError("no clean row to duplicate")
    src = targets[rng.integers(0, len(targets), n_dup)] if n_dup else np.zeros(0, dtype=np.int64)

    def both(primary: np.ndarray, dup: np.ndarray) -> np.ndarray:
        return np.concatenate([primary, dup])

    all_kind = both(kind, np.full(n_dup, _CLEAN, dtype=np.int8))
    all_customer = both(customer, customer[src])
    all_month = both(month, month[src])
    all_currency = both(currency, currency[src])
    all_charged = both(charged, charged[src])
    all_contracted = both(contracted, contracted[src])
    all_refunded = both(refunded, np.zeros(n_dup, dtype=np.int64))
    all_charged_at = both(charged_at, charged_at[src] + rng.integers(60, 3 * _DAY, n_dup))
    all_has_cancel = both(has_cancel, np.zeros(n_dup, dtype=bool))
    all_cancelled_at = both(cancelled_at, np.zeros(n_dup, dtype=np.int64))

    # Final row order: by charge time, like a real export, so invoice numbers grow with time and the
    # duplicates and defects are spread through the file.
    order = np.argsort(all_charged_at, kind="stable")
    take = {
        "kind": all_kind[order],
        "customer": all_customer[order],
        "month": all_month[order],
        "currency": all_currency[order],
        "charged": all_charged[order],
        "contracted": all_contracted[order],
        "refunded": all_refunded[order],
        "charged_at": all_charged_at[order],
        "has_cancel": all_has_cancel[order],
        "cancelled_at": all_cancelled_at[order],
    }

    # Text columns are built with Arrow kernels: an order of magnitude faster than numpy string ops.
    number = _padded(np.arange(1, size + 1), 7)
    customer_num = _padded(take["customer"], 7)
    upper = rng.random(size) < 0.1
    currency_names = pa.array([*_CURRENCIES, *(c.upper() for c in _CURRENCIES)])
    currency_text = pc.take(currency_names, pa.array(take["currency"] + len(_CURRENCIES) * upper))
    naive = rng.random(size) < 0.1
    show_refunded = (take["refunded"] > 0) | (rng.random(size) < 0.5)  # else empty: "nothing refunded"
    refunded_text = pc.if_else(pa.array(show_refunded), money_text(take["refunded"]), "")
    cancelled_text = pc.if_else(pa.array(take["has_cancel"]), _ts_text(take["cancelled_at"], naive), "")
    months, month_index = np.unique(take["month"], return_inverse=True)
    period_text = pc.take(pa.array(np.datetime_as_string(months, unit="M")), pa.array(month_index))

    frame = pd.DataFrame(
        {
            s.INVOICE_ID: _text(pc.binary_join_element_wise(f"INV-{prefix}", number, "-")),
            s.CUSTOMER_ID: _text(pc.binary_join_element_wise(f"CUS-{prefix}", customer_num, "-")),
            s.CUSTOMER_EMAIL: _text(
                pc.binary_join_element_wise("customer", customer_num, f"@{prefix}.example.com", "")
            ),
            s.CHARGE_ID: pd.Series([""] * size, dtype="str"),
            s.CURRENCY: _text(currency_text),
            s.AMOUNT_CHARGED: _text(money_text(take["charged"])),
            s.CONTRACTED_AMOUNT: _text(money_text(take["contracted"])),
            s.ALREADY_REFUNDED: _text(refunded_text),
            s.SERVICE_PERIOD: _text(period_text),
            s.CHARGED_AT: _text(_ts_text(take["charged_at"], naive)),
            s.CANCELLED_AT: _text(cancelled_text),
        },
        columns=list(s.INPUT_COLUMNS),
    )
    _inject_defects(frame, np.flatnonzero(take["kind"] == _MALFORMED), take["charged"], rng)
    return frame.astype("str")


def _inject_defects(
    frame: pd.DataFrame, rows: np.ndarray, charged_cents: np.ndarray, rng: np.random.Generator
) -> None:
    """Break each malformed row in one way validation must catch (in place)."""
    if len(rows) == 0:
        return
    # Every defect kind appears once before any repeats (as long as there are enough malformed rows).
    defect = rng.permutation(np.arange(len(rows)) % _N_DEFECTS)

    def put(which: int, column: str, value: str | Callable[[pd.Series], pd.Series]) -> None:
        idx = rows[defect == which]
        if len(idx) == 0:
            return
        if isinstance(value, str):
            frame.loc[idx, column] = value
        else:
            frame.loc[idx, column] = value(frame[column].iloc[idx]).to_numpy()

    put(0, s.AMOUNT_CHARGED, lambda v: "-" + v)  # negative_amount:amount_charged
    put(1, s.CURRENCY, "jpy")  # unknown_currency (zero-decimal: deliberately unsupported)
    put(2, s.CUSTOMER_EMAIL, "customer at example dot com")  # invalid_email
    put(3, s.CHARGED_AT, "2026-02-30T10:00:00Z")  # invalid_timestamp:charged_at
    put(4, s.AMOUNT_CHARGED, lambda v: v.str.replace(".", ",", regex=False))  # non_numeric_amount
    put(5, s.ALREADY_REFUNDED, lambda v: _text(money_text(charged_cents[v.index.to_numpy()] + 100)))
    put(6, s.CUSTOMER_ID, "")  # missing_customer_id
    put(7, s.CUSTOMER_EMAIL, "j\ufffdrgen@example.com")  # bad_encoding


class ChargeToMake(NamedTuple):
    """One charge a synthetic invoice needs at the provider before its batch can refund it."""

    invoice_id: str
    amount: int
    currency: str
    customer: str


def charges_to_make(chargeable: pd.DataFrame) -> list[ChargeToMake]:
    """The charge of each valid synthetic invoice (``chargeable``: validated, ``charge_id`` not required).

    A synthetic batch has no charges yet: step 1 creates them, keyed by invoice, and a benchmark
    creates them beforehand so that the batch finds them. Both read them here, so a charge made
    ahead of a batch is the one its step 1 would make (same invoice, amount, currency, customer).
    """
    return [
        ChargeToMake(str(invoice), int(amount), str(currency), str(customer))
        for invoice, amount, currency, customer in zip(
            chargeable[s.INVOICE_ID],
            chargeable[s.AMOUNT_CHARGED_CENTS],
            chargeable[s.CURRENCY],
            chargeable[s.CUSTOMER_ID],
            strict=True,
        )
    ]
