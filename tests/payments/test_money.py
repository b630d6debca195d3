"""Amounts in major units as integer cents: the one parse both pipelines' validation uses.

Both the invoices' money columns and the legacy exports' credit go through
``payments.money.parse_money_column``; its rounding and its syntax are tested once here, and each
pipeline's tests keep only what its schema adds (which columns, which bounds).
"""

from __future__ import annotations

import pytest

from durable_assets.payments.money import parse_money_cents


@pytest.mark.parametrize(
    ("text", "cents"),
    [
        ("12.50", 1250),
        ("10.005", 1001),  # half-up
        ("10.004", 1000),
        ("10.0049999", 1000),  # one rounding step, no double rounding
        ("0.995", 100),
        ("0.005", 1),
        ("12", 1200),
        ("12.3", 1230),
        (".5", 50),
        ("5.", 500),
        ("+1.00", 100),
        ("0", 0),
        ("0.00", 0),
        ("-0.00", 0),
        ("0007.10", 710),
        ("92233720368547758.07", 2**63 - 1),  # largest int64 cents
    ],
)
def test_money_parses_to_cents_rounding_half_up(text: str, cents: int) -> None:
    assert parse_money_cents(text) == cents


@pytest.mark.parametrize(
    "text", ["1e3", "1,000.00", "12,34", "NaN", "Infinity", "1_000", "١٢", "", "12.3.4", "$5"]
)
def test_money_rejects_anything_but_plain_decimals(text: str) -> None:
    with pytest.raises(ValueError, match="not a decimal amount"):
        parse_money_cents(text)
