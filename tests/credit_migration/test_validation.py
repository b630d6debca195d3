"""Validating legacy-credit exports and quarantining bad rows: every reason, credit parsing, files end to end.

What the kit's reader does with any file (refusals, trailing commas, Parquet as text, bad bytes)
is tested once in tests/kit/test_tables.py; here only what the legacy schema and validation add.
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from durable_assets.credit_migration import schema as s
from durable_assets.credit_migration.schema import QuarantineReason as R
from durable_assets.credit_migration.validation import read_legacy_file, validate_accounts
from durable_assets.errors import InputFileError
from tests.support.validation import ACCOUNTS, assert_typed_as, declared, dtypes_of, write_file

#: Rows are GOOD with overrides, each of a distinct legacy account unless given.
GOOD = ACCOUNTS.good
frame = ACCOUNTS.frame
reasons_of = ACCOUNTS.reasons_of


def credit_of(text: str) -> int:
    result = validate_accounts(frame({s.CREDIT_BALANCE: text}))
    assert len(result.valid) == 1, result.quarantined[s.REASONS].tolist()
    return int(result.valid["credit_cents"].iloc[0])


# --- the happy path and normalisation --------------------------------------------------------------


def test_good_legacy_account_row_is_normalised_and_typed() -> None:
    raw = frame(
        {
            s.LEGACY_ACCOUNT_ID: " LEG-7 ",
            s.CURRENCY: " EUR ",
            s.CREDIT_BALANCE: " 12.5 ",
            s.UPDATED_AT: "2026-10-01T12:00:00+02:00",
        }
    )
    result = validate_accounts(raw)
    assert result.quarantined.empty
    assert_typed_as(result.valid, s.ACCOUNT_DTYPES)
    row = result.valid.iloc[0]
    assert row[s.ROW_NUMBER] == 1
    assert row[s.LEGACY_ACCOUNT_ID] == "LEG-7"
    assert row[s.EMAIL] == "ada@example.com" and row[s.NAME] == "Ada Lovelace"
    assert row[s.CURRENCY] == "eur"
    assert row["credit_cents"] == 1250
    assert row[s.UPDATED_AT] == pd.Timestamp("2026-10-01T10:00:00", tz="UTC")  # offset converted


@pytest.mark.parametrize("currency", ["USD", "Usd", "uSd", " usd ", "GBP", "ChF"])
def test_currency_is_case_insensitive(currency: str) -> None:
    result = validate_accounts(frame({s.CURRENCY: currency}))
    assert result.quarantined.empty
    assert result.valid[s.CURRENCY].tolist() == [currency.strip().lower()]


@pytest.mark.parametrize(
    ("text", "cents"),
    [
        ("12.50", 1250),
        ("10.005", 1001),  # half-up: the shared parse (tests/payments/test_money.py has its every case)
        ("999999.99", s.MAX_BALANCE_CENTS),  # the provider's largest balance
        ("999999.994", s.MAX_BALANCE_CENTS),  # rounds down onto it
    ],
)
def test_credit_parses_to_cents_rounding_half_up(text: str, cents: int) -> None:
    assert credit_of(text) == cents


@pytest.mark.parametrize(
    "overrides",
    [
        {s.NAME: ""},  # a legacy account may have no name
        {s.NAME: "x" * s.MAX_NAME_LENGTH},
        {s.LEGACY_ACCOUNT_ID: "L" * s.MAX_LEGACY_ID_LENGTH},
        {s.EMAIL: "ada+billing@mail.example.co.uk"},
        {s.NAME: "Jürgen Ü"},  # non-ASCII is fine; only U+FFFD and control characters are not
        {s.UPDATED_AT: "2026-10-01"},
        {s.UPDATED_AT: "2026-10-01 10:00:00"},  # naive: UTC
        {s.CREDIT_BALANCE: "0"},
    ],
)
def test_edge_legacy_account_values_that_are_valid(overrides: dict[str, str]) -> None:
    assert reasons_of(**overrides) == ""


# --- each reason -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("overrides", "expected"),
    [
        ({s.LEGACY_ACCOUNT_ID: ""}, R.EMPTY_LEGACY_ACCOUNT_ID),
        ({s.LEGACY_ACCOUNT_ID: "   "}, R.EMPTY_LEGACY_ACCOUNT_ID),
        ({s.LEGACY_ACCOUNT_ID: "L" * (s.MAX_LEGACY_ID_LENGTH + 1)}, R.LEGACY_ACCOUNT_ID_TOO_LONG),
        ({s.EMAIL: "ada.example.com"}, R.INVALID_EMAIL),
        ({s.EMAIL: "ada@example"}, R.INVALID_EMAIL),
        ({s.EMAIL: "ada lovelace@example.com"}, R.INVALID_EMAIL),
        ({s.EMAIL: ""}, R.INVALID_EMAIL),
        ({s.EMAIL: "a" * s.MAX_EMAIL_LENGTH + "@example.com"}, R.INVALID_EMAIL),  # longer than Stripe's
        ({s.NAME: "x" * (s.MAX_NAME_LENGTH + 1)}, R.NAME_TOO_LONG),
        ({s.CURRENCY: "jpy"}, R.UNKNOWN_CURRENCY),  # zero-decimal: deliberately unsupported
        ({s.CURRENCY: "us dollar"}, R.UNKNOWN_CURRENCY),
        ({s.CURRENCY: ""}, R.UNKNOWN_CURRENCY),
        ({s.CREDIT_BALANCE: "12,50"}, R.NON_NUMERIC_CREDIT),
        ({s.CREDIT_BALANCE: ""}, R.NON_NUMERIC_CREDIT),
        ({s.CREDIT_BALANCE: "1e3"}, R.NON_NUMERIC_CREDIT),
        ({s.CREDIT_BALANCE: "NaN"}, R.NON_NUMERIC_CREDIT),
        ({s.CREDIT_BALANCE: "$5"}, R.NON_NUMERIC_CREDIT),
        ({s.CREDIT_BALANCE: "-12.50"}, R.NEGATIVE_CREDIT),
        ({s.CREDIT_BALANCE: "-0.004"}, R.NEGATIVE_CREDIT),  # negative before rounding
        ({s.CREDIT_BALANCE: "1000000.00"}, R.CREDIT_TOO_LARGE),  # above the provider's balance limit
        ({s.CREDIT_BALANCE: "999999.995"}, R.CREDIT_TOO_LARGE),  # rounds up past it
        ({s.CREDIT_BALANCE: "1" * 20}, R.CREDIT_TOO_LARGE),  # beyond int64 cents
        ({s.UPDATED_AT: "2026-02-30T10:00:00Z"}, R.INVALID_TIMESTAMP),
        ({s.UPDATED_AT: "yesterday"}, R.INVALID_TIMESTAMP),
        ({s.UPDATED_AT: ""}, R.INVALID_TIMESTAMP),
        ({s.NAME: "J\ufffdrgen"}, R.BAD_ENCODING),
        ({s.LEGACY_ACCOUNT_ID: "LEG\x00-1"}, R.BAD_ENCODING),
        ({s.EMAIL: "ada\x1b[31m@example.com"}, R.BAD_ENCODING),
    ],
)
def test_each_bad_legacy_account_value_is_quarantined_with_its_reason(
    overrides: dict[str, str], expected: R
) -> None:
    assert reasons_of(**overrides) == expected.value


def test_every_quarantine_reason_is_covered_above() -> None:
    """A new reason in the schema must get its own row in the table above."""
    assert {r.value for r in R} == {
        "empty_legacy_account_id",
        "legacy_account_id_too_long",
        "duplicate_legacy_account_id",
        "invalid_email",
        "name_too_long",
        "unknown_currency",
        "non_numeric_credit",
        "negative_credit",
        "credit_too_large",
        "invalid_timestamp",
        "bad_encoding",
    }


def test_all_reasons_of_a_legacy_account_row_are_reported_in_a_stable_order() -> None:
    reasons = reasons_of(
        **{
            s.LEGACY_ACCOUNT_ID: "L" * 65,
            s.EMAIL: "not-an-email",
            s.NAME: "x" * 300,
            s.CURRENCY: "xyz",
            s.CREDIT_BALANCE: "-3",
            s.UPDATED_AT: "never",
        }
    )
    assert reasons == (
        "legacy_account_id_too_long;invalid_email;name_too_long;unknown_currency;negative_credit;"
        "invalid_timestamp"
    )
    assert reasons_of(**{s.LEGACY_ACCOUNT_ID: "", s.CREDIT_BALANCE: "ten", s.NAME: "\ufffd"}) == (
        "empty_legacy_account_id;non_numeric_credit;bad_encoding"
    )
    assert (
        reasons_of(**{s.CREDIT_BALANCE: "5000000", s.CURRENCY: "JPY"}) == "unknown_currency;credit_too_large"
    )


def test_duplicate_legacy_ids_quarantine_every_copy() -> None:
    raw = frame(
        {s.LEGACY_ACCOUNT_ID: "LEG-A"},
        {s.LEGACY_ACCOUNT_ID: "LEG-B"},
        {s.LEGACY_ACCOUNT_ID: "LEG-A", s.CREDIT_BALANCE: "99.00"},  # which credit is right? neither
        {s.LEGACY_ACCOUNT_ID: "LEG-C"},
        {s.LEGACY_ACCOUNT_ID: " LEG-A "},  # same ID once stripped
        {s.LEGACY_ACCOUNT_ID: "leg-a"},  # IDs are case-sensitive: another account
        {s.LEGACY_ACCOUNT_ID: "", s.EMAIL: "x@example.com"},
        {s.LEGACY_ACCOUNT_ID: ""},  # two empty IDs are "empty", not "duplicate"
        {s.LEGACY_ACCOUNT_ID: "LEG-B", s.CURRENCY: "jpy"},  # a bad copy still taints the good one
    )
    result = validate_accounts(raw)
    assert result.valid[s.LEGACY_ACCOUNT_ID].tolist() == ["LEG-C", "leg-a"]
    q = result.quarantined
    assert q[s.ROW_NUMBER].tolist() == [1, 2, 3, 5, 7, 8, 9]
    assert q[s.REASONS].tolist() == [
        "duplicate_legacy_account_id",
        "duplicate_legacy_account_id",
        "duplicate_legacy_account_id",
        "duplicate_legacy_account_id",
        "empty_legacy_account_id",
        "empty_legacy_account_id",
        "duplicate_legacy_account_id;unknown_currency",
    ]


def test_no_legacy_account_row_is_dropped_and_quarantine_keeps_the_original_strings() -> None:
    raw = frame({}, {s.CREDIT_BALANCE: "-3", s.CURRENCY: "XXX"}, {}, {s.UPDATED_AT: "bad"}, {})
    raw.index = pd.Index([10, 20, 30, 40, 50])  # row numbers are positional, whatever the index
    result = validate_accounts(raw)
    assert len(result.valid) + len(result.quarantined) == len(raw)
    assert result.valid[s.ROW_NUMBER].tolist() == [1, 3, 5]
    assert result.valid.index.tolist() == [0, 1, 2]
    q = result.quarantined
    assert list(q.columns) == [*s.INPUT_COLUMNS, s.ROW_NUMBER, s.REASONS]
    assert q[s.ROW_NUMBER].tolist() == [2, 4]
    assert q[s.CREDIT_BALANCE].tolist() == ["-3", "12.50"]
    assert q[s.CURRENCY].tolist() == ["XXX", "usd"]  # as given, not normalised
    ids = [*result.valid[s.LEGACY_ACCOUNT_ID], *q[s.LEGACY_ACCOUNT_ID]]
    assert sorted(ids) == sorted(raw[s.LEGACY_ACCOUNT_ID])
    assert result.reason_counts() == {"invalid_timestamp": 1, "negative_credit": 1, "unknown_currency": 1}


def test_zero_rows_give_empty_typed_frames() -> None:
    result = validate_accounts(frame())
    assert result.valid.empty and result.quarantined.empty
    assert_typed_as(result.valid, s.ACCOUNT_DTYPES)
    assert result.reason_counts() == {}


def test_a_frame_whose_rows_are_all_quarantined() -> None:
    raw = frame({s.CURRENCY: "jpy"}, {s.CREDIT_BALANCE: "-1"}, {s.EMAIL: "nope"})
    result = validate_accounts(raw)
    assert result.valid.empty and len(result.quarantined) == 3
    assert dtypes_of(result.valid) == declared(s.ACCOUNT_DTYPES)
    assert result.reason_counts() == {"invalid_email": 1, "negative_credit": 1, "unknown_currency": 1}


def test_a_legacy_account_frame_lacking_required_columns_is_refused_naming_them() -> None:
    with pytest.raises(
        InputFileError, match="legacy account frame is missing required columns: email, credit_balance"
    ):
        validate_accounts(frame({}).drop(columns=[s.EMAIL, s.CREDIT_BALANCE]))


def test_numeric_and_none_cells_of_a_legacy_account_frame_validate_as_their_text() -> None:
    raw = frame({}).astype(object)
    raw[s.CREDIT_BALANCE] = [12]
    raw[s.NAME] = [None]
    result = validate_accounts(raw)
    assert result.valid["credit_cents"].tolist() == [1200]
    assert result.valid[s.NAME].tolist() == [""]


# --- legacy exports end to end: read_legacy_file, then validate_accounts ---------------------------


def test_a_legacy_export_csv_validates_from_its_stripped_text(tmp_path: Path) -> None:
    path = tmp_path / "export.csv"
    path.write_text(
        " legacy_account_id ,email,name,currency,credit_balance,updated_at,note\n"
        " LEG-1 , ada@example.com ,,USD,  10.005 ,2026-10-01T00:00:00Z,NA\n",
        encoding="utf-8",
    )
    result = validate_accounts(read_legacy_file(path))
    assert result.valid[s.LEGACY_ACCOUNT_ID].tolist() == ["LEG-1"]
    assert result.valid[s.NAME].tolist() == [""]
    assert result.valid["credit_cents"].tolist() == [1001]
    assert result.valid[s.CURRENCY].tolist() == ["usd"]


@pytest.mark.parametrize("suffix", [".csv", ".parquet"])
def test_a_header_only_legacy_export_validates_to_zero_typed_rows(tmp_path: Path, suffix: str) -> None:
    path = write_file(tmp_path / f"header{suffix}", frame())
    result = validate_accounts(read_legacy_file(path))
    assert result.valid.empty and result.quarantined.empty
    assert dtypes_of(result.valid) == declared(s.ACCOUNT_DTYPES)


def test_an_invoice_file_is_not_a_legacy_export(tmp_path: Path) -> None:
    path = tmp_path / "invoices.csv"
    path.write_text("invoice_id,customer_id,customer_email,currency,amount_charged\nINV-1,C,a@b.co,usd,1\n")
    with pytest.raises(InputFileError, match=r"invoices\.csv: missing required columns: legacy_account_id"):
        read_legacy_file(path)


def test_a_legacy_export_with_a_trailing_comma_on_every_row_validates_cleanly(tmp_path: Path) -> None:
    raw = frame({}, {s.NAME: ""}, {s.CREDIT_BALANCE: "0.01"})
    path = write_file(tmp_path / "export.csv", raw, trailing_comma=True)
    result = validate_accounts(read_legacy_file(path))
    assert result.quarantined.empty
    assert result.valid["credit_cents"].tolist() == [1250, 1250, 1]


def test_a_legacy_export_in_parquet_validates_like_its_frame(tmp_path: Path) -> None:
    raw = frame({}, {s.CURRENCY: "bad"}, {s.CREDIT_BALANCE: "0.005"})
    path = write_file(tmp_path / "export.parquet", raw)
    result = validate_accounts(read_legacy_file(path))
    assert result.valid["credit_cents"].tolist() == [1250, 1]
    assert result.quarantined[s.REASONS].tolist() == ["unknown_currency"]


def test_a_legacy_export_in_parquet_with_typed_columns_validates_from_their_text(tmp_path: Path) -> None:
    import datetime as dt
    from decimal import Decimal

    table = pa.table(
        {
            **{c: pa.array([GOOD[c], GOOD[c]]) for c in s.INPUT_COLUMNS},
            s.LEGACY_ACCOUNT_ID: pa.array(["LEG-1", "LEG-2"]),
            s.CREDIT_BALANCE: pa.array([Decimal("12.34"), Decimal("0.50")], pa.decimal128(10, 2)),
            s.UPDATED_AT: pa.array(
                [dt.datetime(2026, 10, 1, 10, tzinfo=dt.UTC)] * 2, pa.timestamp("us", tz="UTC")
            ),
            s.NAME: pa.array([b"Ada", b"J\xfcrgen"], pa.binary()),
        }
    )
    path = tmp_path / "typed.parquet"
    pq.write_table(table, path)
    result = validate_accounts(read_legacy_file(path))
    assert result.quarantined[s.REASONS].tolist() == ["bad_encoding"]  # the undecodable binary name
    valid = result.valid
    assert valid["credit_cents"].tolist() == [1234]
    assert valid[s.UPDATED_AT].tolist() == [pd.Timestamp("2026-10-01T10:00:00Z")]
