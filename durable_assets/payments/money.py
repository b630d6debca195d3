"""Money as the payment provider counts it: integer minor units in two-decimal currencies.

Shared by every pipeline that reads amounts from a file (invoice amounts, legacy credit), so
"10.005" means the same number of cents everywhere. Amounts are parsed with :class:`decimal.Decimal`
(never ``float``), once per *distinct* string (``pd.factorize``): amounts repeat a lot, so a million
rows typically have tens of thousands of distinct values, and the exact arithmetic stays fast.
"""

from __future__ import annotations

from dataclasses import dataclass
from decimal import ROUND_HALF_UP, Context, Decimal
from typing import Final

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

#: Accepted currencies (lowercase, as the payment provider spells them). All have exactly two minor-unit
#: digits, which is what makes "integer cents" correct for every one of them; zero-decimal (JPY) or
#: three-decimal (KWD) currencies are deliberately not accepted until the money code handles them.
ACCEPTED_CURRENCIES: Final[frozenset[str]] = frozenset({"usd", "eur", "gbp", "cad", "aud", "chf"})

#: Minor units per major unit for every accepted currency.
CENTS_PER_UNIT: Final = 100

#: Plain decimal notation only: optional sign, ASCII digits, optional "." fraction. No exponent ("1e3"),
#: no thousands separators ("1,000.00"), no "NaN"/"Infinity", no underscores, no non-ASCII digits —
#: all of which ``Decimal()`` would otherwise happily accept.
_DECIMAL_PATTERN: Final = r"[+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)"
#: int64 cents hold at most 19 digits, so more than 17 significant integer digits can never fit (and
#: must not reach Decimal arithmetic or numpy, where they would overflow).
_AT_MOST_17_INTEGER_DIGITS: Final = r"[+-]?0*[0-9]{0,17}(?:\.[0-9]*)?"
_CENT: Final = Decimal("0.01")
#: Wide enough that quantizing any amount with at most 17 integer digits to the cent is exact.
_DECIMAL_CONTEXT: Final = Context(prec=64)
_INT64_MAX: Final = int(np.iinfo(np.int64).max)

# Parse outcomes, per distinct value.
_OK, _NON_NUMERIC, _NEGATIVE, _TOO_LARGE = 0, 1, 2, 3


@dataclass(frozen=True)
class MoneyColumn:
    """Per-row parse outcome of one money column (all arrays have the column's length)."""

    cents: np.ndarray
    non_numeric: np.ndarray
    negative: np.ndarray
    too_large: np.ndarray

    @property
    def usable(self) -> np.ndarray:
        """Rows whose amount parsed, is not negative and fits."""
        return ~(self.non_numeric | self.negative | self.too_large)


def parse_money_column(values: pd.Series, *, empty_means_zero: bool = False) -> MoneyColumn:
    """A column of stripped amount strings (major units) as int64 cents, rounded half-up.

    The syntax and size checks run as Arrow regex kernels over the distinct strings; only strings
    that pass reach the Python loop, where ``Decimal`` does the exact arithmetic: quantize to the cent
    half-up (one rounding step on the exact value, so ``10.0049999`` is 1000, not 1001), then scale.
    """
    codes, uniques = pd.factorize(values, sort=False)
    texts = pd.Series(uniques, dtype="str")
    n = len(texts)
    syntax_ok = _mask(texts.str.fullmatch(_DECIMAL_PATTERN))
    fits = _mask(texts.str.fullmatch(_AT_MOST_17_INTEGER_DIGITS))
    status_u = np.where(syntax_ok, np.where(fits, _OK, _TOO_LARGE), _NON_NUMERIC).astype(np.int8)
    if empty_means_zero:
        status_u[_mask(texts == "")] = _OK  # optional amount left empty: 0 cents
    cents_u = np.zeros(n, dtype=np.int64)
    todo = np.flatnonzero(syntax_ok & fits)
    for i, text in zip(todo.tolist(), texts.iloc[todo].tolist(), strict=True):
        amount = Decimal(text)
        cents = int(amount.quantize(_CENT, rounding=ROUND_HALF_UP, context=_DECIMAL_CONTEXT).scaleb(2))
        if abs(cents) > _INT64_MAX:  # 17 digits can still exceed 92,233,720,368,547,758.07
            status_u[i] = _TOO_LARGE
            continue
        cents_u[i] = cents
        if amount < 0:
            # Judged on the exact value, not the rounded one: "-0.004" is still a negative amount.
            status_u[i] = _NEGATIVE
    row_codes = np.asarray(codes, dtype=np.intp)
    status = status_u[row_codes]
    return MoneyColumn(
        cents=cents_u[row_codes],
        non_numeric=status == _NON_NUMERIC,
        negative=status == _NEGATIVE,
        too_large=status == _TOO_LARGE,
    )


def parse_money_cents(text: str) -> int:
    """One decimal amount in major units as integer cents, rounding half-up (``10.005`` → 1001).

    Exactly what the pipelines do to every amount (it *is* the same code, run on a one-element
    column). Raises ``ValueError`` for anything that is not plain decimal notation or does not fit
    int64 cents. Negative amounts come back as negative cents: whether they are allowed is the
    caller's business.
    """
    parsed = parse_money_column(pd.Series([text.strip()], dtype="str"))
    if parsed.non_numeric[0]:
        raise ValueError(f"not a decimal amount: {text!r}")
    if parsed.too_large[0]:
        raise ValueError(f"amount too large for int64 cents: {text!r}")
    return int(parsed.cents[0])


def money_text(cents: np.ndarray) -> pa.Array:
    """Non-negative integer cents as "12.34" (integer arithmetic only: no float ever sees money)."""
    major = pc.cast(pa.array(cents // CENTS_PER_UNIT, pa.int64()), pa.string())
    minor = pc.utf8_lpad(pc.cast(pa.array(cents % CENTS_PER_UNIT, pa.int64()), pa.string()), 2, "0")
    return pc.binary_join_element_wise(major, minor, ".")


def format_cents(cents: int, currency: str) -> str:
    """``-1234, "usd"`` as ``-12.34 USD``, for messages and notices."""
    sign = "-" if cents < 0 else ""
    major, minor = divmod(abs(int(cents)), CENTS_PER_UNIT)
    return f"{sign}{major}.{minor:02d} {currency.upper()}"


def _mask(series: pd.Series) -> np.ndarray:
    return series.fillna(False).to_numpy(dtype=bool)
