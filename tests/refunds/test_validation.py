"""Validating invoices and quarantining bad rows: every reason, money rounding, invoice files end to end.

What the kit's reader does with any file (refusals, trailing commas, Parquet as text, bad bytes)
is tested once in tests/kit/test_tables.py; here only what the invoice schema and validation add.
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from durable_assets.errors import InputFileError
from durable_assets.refunds import schema as s
from durable_assets.refunds.validation import read_invoice_file, validate_invoices
from tests.support.validation import INVOICES, assert_typed_as, write_file

#: Rows are GOOD with overrides, each of a distinct invoice and charge unless given.
GOOD = INVOICES.good
frame = INVOICES.frame
reasons_of = INVOICES.reasons_of


def cents_of(column: str, text: str) -> int:
    result = validate_invoices(frame({s.AMOUNT_CHARGED: "1000", column: text}))
    assert len(result.valid) == 1, result.quarantined[s.REASONS].tolist()
    return int(result.valid[s.MONEY_COLUMNS[column]].iloc[0])


# --- the happy path and normalisation --------------------------------------------------------------


def test_good_invoice_row_is_normalised_and_typed() -> None:
    result = validate_invoices(frame({s.CURRENCY: " EUR ", s.CANCELLED_AT: "2026-10-05T12:00:00+02:00"}))
    assert result.quarantined.empty
    assert_typed_as(result.valid, s.VALID_DTYPES)
    row = result.valid.iloc[0]
    assert row[s.ROW_NUMBER] == 1
    assert row[s.CURRENCY] == "eur"
    assert row[s.AMOUNT_CHARGED_CENTS] == 1234
    assert row[s.ALREADY_REFUNDED_CENTS] == 0
    assert row[s.CHARGED_AT] == pd.Timestamp("2026-10-01T10:00:00", tz="UTC")
    assert row[s.CANCELLED_AT] == pd.Timestamp("2026-10-05T10:00:00", tz="UTC")  # offset converted


def test_naive_timestamp_means_utc_and_empty_cancelled_at_is_nat() -> None:
    result = validate_invoices(frame({s.CHARGED_AT: "2026-10-01 10:00:00"}))
    assert result.valid[s.CHARGED_AT].iloc[0] == pd.Timestamp("2026-10-01T10:00:00Z")
    assert pd.isna(result.valid[s.CANCELLED_AT].iloc[0])


def test_rounding_applies_to_every_money_column() -> None:
    assert cents_of(s.AMOUNT_CHARGED, "10.005") == 1001
    assert cents_of(s.CONTRACTED_AMOUNT, "10.004") == 1000
    assert cents_of(s.ALREADY_REFUNDED, "0.015") == 2


def test_already_refunded_defaults_to_zero_when_empty_or_absent() -> None:
    assert cents_of(s.ALREADY_REFUNDED, "") == 0
    raw = frame({}).drop(columns=[s.ALREADY_REFUNDED])
    result = validate_invoices(raw)
    assert result.valid[s.ALREADY_REFUNDED_CENTS].tolist() == [0]
    assert list(result.quarantined.columns) == [
        *(c for c in s.INPUT_COLUMNS if c != s.ALREADY_REFUNDED),
        s.ROW_NUMBER,
        s.REASONS,
    ]


# --- each reason -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("overrides", "expected"),
    [
        ({s.INVOICE_ID: ""}, "empty_invoice_id"),
        ({s.INVOICE_ID: "   "}, "empty_invoice_id"),
        ({s.CUSTOMER_ID: ""}, "missing_customer_id"),
        ({s.CUSTOMER_EMAIL: "ada.example.com"}, "invalid_email"),
        ({s.CUSTOMER_EMAIL: "ada@example"}, "invalid_email"),
        ({s.CUSTOMER_EMAIL: "ada lovelace@example.com"}, "invalid_email"),
        ({s.CUSTOMER_EMAIL: "ada@@example.com"}, "invalid_email"),
        ({s.CUSTOMER_EMAIL: ""}, "invalid_email"),
        ({s.CHARGE_ID: ""}, "missing_charge_id"),
        ({s.CURRENCY: "jpy"}, "unknown_currency"),
        ({s.CURRENCY: "us dollar"}, "unknown_currency"),
        ({s.CURRENCY: ""}, "unknown_currency"),
        ({s.AMOUNT_CHARGED: "12,34"}, "non_numeric_amount:amount_charged"),
        ({s.AMOUNT_CHARGED: ""}, "non_numeric_amount:amount_charged"),
        ({s.CONTRACTED_AMOUNT: "ten"}, "non_numeric_amount:contracted_amount"),
        ({s.ALREADY_REFUNDED: "n/a"}, "non_numeric_amount:already_refunded"),
        ({s.AMOUNT_CHARGED: "-1.00"}, "negative_amount:amount_charged"),
        ({s.CONTRACTED_AMOUNT: "-0.01"}, "negative_amount:contracted_amount"),
        ({s.ALREADY_REFUNDED: "-0.004"}, "negative_amount:already_refunded"),  # negative before rounding
        ({s.AMOUNT_CHARGED: "1" * 20}, "amount_too_large:amount_charged"),
        ({s.CONTRACTED_AMOUNT: "92233720368547758.08"}, "amount_too_large:contracted_amount"),
        ({s.ALREADY_REFUNDED: "12.35"}, "refunded_exceeds_charged"),
        ({s.CHARGED_AT: "2026-02-30T10:00:00Z"}, "invalid_timestamp:charged_at"),
        ({s.CHARGED_AT: ""}, "invalid_timestamp:charged_at"),
        ({s.CANCELLED_AT: "yesterday"}, "invalid_timestamp:cancelled_at"),
        ({s.SERVICE_PERIOD: ""}, "missing_service_period"),
        ({s.SERVICE_PERIOD: "2026-13"}, "invalid_service_period"),
        ({s.SERVICE_PERIOD: "Oct 2026"}, "invalid_service_period"),
        ({s.CUSTOMER_EMAIL: "j\ufffdrgen@example.com"}, "bad_encoding"),
        ({s.CUSTOMER_ID: "CUS\x00-1"}, "bad_encoding"),
        ({s.CHARGE_ID: "ch_\x1b[31m"}, "bad_encoding"),
    ],
)
def test_each_bad_invoice_value_is_quarantined_with_its_reason(
    overrides: dict[str, str], expected: str
) -> None:
    assert reasons_of(**overrides) == expected


@pytest.mark.parametrize(
    "overrides",
    [
        {s.ALREADY_REFUNDED: "12.34"},  # refunded == charged is fine (nothing left to refund)
        {s.AMOUNT_CHARGED: "0", s.CONTRACTED_AMOUNT: "0.00"},
        {s.CURRENCY: "ChF"},
        {s.CHARGED_AT: "2026-10-01"},
        {s.CUSTOMER_EMAIL: "ada+billing@mail.example.co.uk"},
        {s.CUSTOMER_ID: "Jürgen Ü"},  # non-ASCII is fine; only U+FFFD and control characters are not
    ],
)
def test_edge_invoice_values_that_are_valid(overrides: dict[str, str]) -> None:
    assert reasons_of(**overrides) == ""


def test_every_row_naming_a_shared_charge_is_quarantined() -> None:
    """Issue #14.3: a charge pays one invoice; rows that share one could refund it once per row."""
    result = validate_invoices(frame({}, {s.CHARGE_ID: "ch_x"}, {s.CHARGE_ID: "ch_x"}, {s.CHARGE_ID: "ch_x"}))
    assert list(result.valid[s.INVOICE_ID]) == ["INV-1"]
    assert list(result.quarantined[s.REASONS]) == ["shared_charge_id"] * 3


def test_missing_charge_id_is_allowed_when_not_required() -> None:
    result = validate_invoices(frame({s.CHARGE_ID: ""}), require_charge_id=False)
    assert len(result.valid) == 1
    assert result.valid[s.CHARGE_ID].tolist() == [""]


def test_all_reasons_of_an_invoice_row_are_reported_in_a_stable_order() -> None:
    reasons = reasons_of(
        **{
            s.CUSTOMER_ID: "",
            s.CURRENCY: "xyz",
            s.AMOUNT_CHARGED: "abc",
            s.CONTRACTED_AMOUNT: "-5",
            s.CHARGED_AT: "never",
            s.SERVICE_PERIOD: "",
            s.CUSTOMER_EMAIL: "\ufffd",
        }
    )
    assert reasons == (
        "missing_customer_id;invalid_email;unknown_currency;non_numeric_amount:amount_charged;"
        "negative_amount:contracted_amount;invalid_timestamp:charged_at;missing_service_period;bad_encoding"
    )


def test_duplicate_invoice_ids_quarantine_every_copy() -> None:
    raw = frame(
        {s.INVOICE_ID: "INV-A"},
        {s.INVOICE_ID: "INV-B"},
        {s.INVOICE_ID: "INV-A", s.AMOUNT_CHARGED: "99.00"},
        {s.INVOICE_ID: "INV-C"},
        {s.INVOICE_ID: " INV-A "},  # same id once stripped
        {s.INVOICE_ID: "", s.CUSTOMER_ID: "x"},
        {s.INVOICE_ID: ""},  # two empty ids are "empty", not "duplicate"
    )
    result = validate_invoices(raw)
    assert result.valid[s.INVOICE_ID].tolist() == ["INV-B", "INV-C"]
    q = result.quarantined
    assert q[s.ROW_NUMBER].tolist() == [1, 3, 5, 6, 7]
    assert q[s.REASONS].tolist() == ["duplicate_invoice_id"] * 3 + ["empty_invoice_id"] * 2


def test_no_invoice_row_is_dropped_and_quarantine_keeps_the_original_strings() -> None:
    raw = frame({}, {s.AMOUNT_CHARGED: "-3", s.CURRENCY: "XXX"}, {}, {s.CHARGED_AT: "bad"})
    raw.index = pd.Index([10, 20, 30, 40])  # row numbers are positional, whatever the index
    result = validate_invoices(raw)
    assert result.total_rows == len(raw) == len(result.valid) + len(result.quarantined)
    assert result.valid[s.ROW_NUMBER].tolist() == [1, 3]
    assert result.valid.index.tolist() == [0, 1]
    q = result.quarantined
    assert list(q.columns) == [*s.INPUT_COLUMNS, s.ROW_NUMBER, s.REASONS]
    assert q[s.ROW_NUMBER].tolist() == [2, 4]
    assert q[s.AMOUNT_CHARGED].tolist() == ["-3", "12.34"]
    assert q[s.CURRENCY].tolist() == ["XXX", "usd"]  # as given, not normalised
    assert sorted([*result.valid[s.INVOICE_ID], *q[s.INVOICE_ID]]) == sorted(raw[s.INVOICE_ID])
    assert result.reason_counts() == {
        "invalid_timestamp:charged_at": 1,
        "negative_amount:amount_charged": 1,
        "unknown_currency": 1,
    }


def test_empty_frame_gives_empty_typed_frames() -> None:
    result = validate_invoices(frame())
    assert result.valid.empty and result.quarantined.empty
    assert list(result.valid.columns) == list(s.VALID_COLUMNS)
    assert str(result.valid[s.AMOUNT_CHARGED_CENTS].dtype) == "int64"


def test_an_invoice_frame_lacking_required_columns_is_refused_naming_them() -> None:
    with pytest.raises(
        InputFileError, match="invoice frame is missing required columns: customer_email, charge_id"
    ):
        validate_invoices(frame({}).drop(columns=[s.CUSTOMER_EMAIL, s.CHARGE_ID]))


def test_numeric_and_none_cells_of_an_invoice_frame_validate_as_their_text() -> None:
    raw = frame({}).astype(object)
    raw[s.AMOUNT_CHARGED] = [12.34]
    raw[s.CONTRACTED_AMOUNT] = [12]
    raw[s.CANCELLED_AT] = [None]
    result = validate_invoices(raw)
    assert result.valid[s.AMOUNT_CHARGED_CENTS].tolist() == [1234]
    assert result.valid[s.CONTRACTED_CENTS].tolist() == [1200]
    assert pd.isna(result.valid[s.CANCELLED_AT].iloc[0])


# --- invoice files end to end: read_invoice_file, then validate_invoices --------------------------


def test_an_invoice_csv_validates_from_its_stripped_text(tmp_path: Path) -> None:
    path = tmp_path / "in.csv"
    path.write_text(
        " invoice_id ,customer_id,customer_email,charge_id,currency,amount_charged,contracted_amount,"
        "service_period,charged_at,cancelled_at,note\n"
        " INV-1 , CUS-1 ,a@b.co,ch_1, USD ,  10.005 ,10,2026-10,2026-10-01T00:00:00Z,,NA\n",
        encoding="utf-8",
    )
    result = validate_invoices(read_invoice_file(path))
    assert result.valid[s.INVOICE_ID].tolist() == ["INV-1"]
    assert result.valid[s.AMOUNT_CHARGED_CENTS].tolist() == [1001]
    assert result.valid[s.ALREADY_REFUNDED_CENTS].tolist() == [0]  # optional column absent
    assert pd.isna(result.valid[s.CANCELLED_AT].iloc[0])


def test_bad_bytes_in_an_extra_column_still_quarantine_the_row(tmp_path: Path) -> None:
    raw = frame({}, {})
    raw["note"] = ["fine", "x"]
    path = write_file(tmp_path / "in.csv", raw)
    path.write_bytes(path.read_bytes().replace(b",x\n", b",\x80\n"))
    result = validate_invoices(read_invoice_file(path))
    assert result.quarantined[s.REASONS].tolist() == ["bad_encoding"]
    assert "note" in result.quarantined.columns


@pytest.mark.parametrize("suffix", [".csv", ".parquet"])
def test_a_header_only_invoice_file_validates_to_zero_typed_rows(tmp_path: Path, suffix: str) -> None:
    path = write_file(tmp_path / f"header{suffix}", frame())
    result = validate_invoices(read_invoice_file(path))
    assert result.total_rows == 0
    assert result.valid.empty and result.quarantined.empty
    assert_typed_as(result.valid, s.VALID_DTYPES)


def test_an_invoice_export_with_a_trailing_comma_on_every_row_validates_cleanly(tmp_path: Path) -> None:
    raw = frame({}, {s.CANCELLED_AT: "2026-10-02T00:00:00Z"})
    path = write_file(tmp_path / "export.csv", raw, trailing_comma=True)
    result = validate_invoices(read_invoice_file(path))
    assert result.quarantined.empty
    assert result.valid[s.CANCELLED_AT].tolist()[1] == pd.Timestamp("2026-10-02T00:00:00Z")


def test_an_invoice_parquet_file_validates_like_its_frame(tmp_path: Path) -> None:
    raw = frame({}, {s.CURRENCY: "bad"}, {s.CANCELLED_AT: "2026-10-02T00:00:00Z"})
    path = write_file(tmp_path / "in.parquet", raw)
    result = validate_invoices(read_invoice_file(path))
    assert len(result.valid) == 2
    assert result.quarantined[s.REASONS].tolist() == ["unknown_currency"]


def test_an_invoice_parquet_file_with_typed_columns_validates_from_their_text(tmp_path: Path) -> None:
    import datetime as dt
    from decimal import Decimal

    table = pa.table(
        {
            **{c: pa.array([GOOD[c]]) for c in s.INPUT_COLUMNS},
            s.AMOUNT_CHARGED: pa.array([Decimal("12.34")], pa.decimal128(10, 2)),
            s.CONTRACTED_AMOUNT: pa.array([10], pa.int64()),
            s.CHARGED_AT: pa.array(
                [dt.datetime(2026, 10, 1, 10, tzinfo=dt.UTC)], pa.timestamp("us", tz="UTC")
            ),
            s.CANCELLED_AT: pa.array([None], pa.timestamp("us")),
            s.CUSTOMER_ID: pa.array([b"CUS-\xff"], pa.binary()),
        }
    )
    path = tmp_path / "typed.parquet"
    pq.write_table(table, path)
    raw = read_invoice_file(path)
    result = validate_invoices(raw)
    assert result.quarantined[s.REASONS].tolist() == ["bad_encoding"]  # the undecodable binary value
    fixed = raw.assign(**{s.CUSTOMER_ID: "CUS-1"})
    valid = validate_invoices(fixed).valid
    assert valid[s.AMOUNT_CHARGED_CENTS].tolist() == [1234]
    assert valid[s.CONTRACTED_CENTS].tolist() == [1000]
    assert valid[s.CHARGED_AT].tolist() == [pd.Timestamp("2026-10-01T10:00:00Z")]
    assert pd.isna(valid[s.CANCELLED_AT].iloc[0])  # a null timestamp is an empty cancelled_at
