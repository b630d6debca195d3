"""kit/tables.py: what every pipeline's reader and row checks do, tested once with a generic schema.

The refusals say what is wrong with the file, in words a person reads (#23); the pipelines' own
tests (tests/refunds, tests/credit_migration) keep only what their schemas and validations add.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable
from decimal import Decimal
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from durable_assets.credit_migration import schema as accounts
from durable_assets.credit_migration.validation import read_legacy_file
from durable_assets.errors import InputFileError
from durable_assets.kit.tables import (
    REASONS,
    ROW_NUMBER,
    RowChecks,
    Validated,
    as_mask,
    bad_encoding,
    read_text_table,
    require_columns,
    text_columns,
)
from durable_assets.refunds import schema as invoices
from durable_assets.refunds.validation import read_invoice_file
from tests.support.validation import ACCOUNTS, INVOICES, RawRows

COLUMNS = ["a", "b"]


def test_binary_content_is_named_with_its_offset(tmp_path: Path) -> None:
    path = tmp_path / "photo.csv"
    path.write_bytes(b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR" + bytes(range(256)))
    with pytest.raises(InputFileError) as caught:
        read_text_table(path, columns=COLUMNS, required=COLUMNS)
    assert str(caught.value).startswith(f"{path}: not a text CSV file (binary content at byte 8)")
    assert "fields" not in str(caught.value)


def test_a_parquet_file_named_csv_is_told_to_be_renamed(tmp_path: Path) -> None:
    path = tmp_path / "export.csv"
    pd.DataFrame({"a": ["1"], "b": ["2"]}).to_parquet(path)
    with pytest.raises(InputFileError, match=r"binary content at byte \d+\) \(it is a Parquet file: name it"):
        read_text_table(path, columns=COLUMNS, required=COLUMNS)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("a\n1,2\n", "line 2 has 2 fields but the header names 1 column;"),
        ("a,b\n1\n", "line 2 has 1 field but the header names 2 columns;"),
    ],
)
def test_field_counts_are_singular_or_plural(tmp_path: Path, text: str, message: str) -> None:
    path = tmp_path / "t.csv"
    path.write_text(text)
    with pytest.raises(InputFileError) as caught:
        read_text_table(path, columns=COLUMNS, required=["a"])
    assert message in str(caught.value), caught.value


def test_utf8_text_still_reads(tmp_path: Path) -> None:
    path = tmp_path / "ok.csv"
    path.write_text("a,b\nZoë,2\n")
    frame = read_text_table(path, columns=COLUMNS, required=COLUMNS)
    assert frame.to_dict("records") == [{"a": "Zoë", "b": "2"}]


# --- what every pipeline's reader does (#36 item 5: once here, not once per pipeline) --------------


def table(*rows: tuple[str, str]) -> pd.DataFrame:
    """A raw text frame of the generic schema, as a pipeline's frame() helper builds one."""
    return pd.DataFrame([list(row) for row in rows], columns=COLUMNS, dtype="str")


def read(path: Path) -> pd.DataFrame:
    return read_text_table(path, columns=COLUMNS, required=COLUMNS)


def lines(raw: pd.DataFrame) -> list[str]:
    return raw.to_csv(index=False).splitlines()


@pytest.mark.parametrize("name", ["nope.csv", "nope.parquet"])
def test_a_missing_file_is_an_input_error_naming_it(tmp_path: Path, name: str) -> None:
    path = tmp_path / name
    with pytest.raises(InputFileError, match=r"nope\.") as caught:
        read(path)
    assert str(caught.value).startswith(f"{path}: ")
    assert caught.value.exit_code == 2


def test_a_directory_is_an_input_error_naming_it(tmp_path: Path) -> None:
    path = tmp_path / "dir.csv"
    path.mkdir()
    with pytest.raises(InputFileError, match=r"dir\.csv"):
        read(path)


@pytest.mark.parametrize("name", ["in.txt", "in", "in.xlsx"])
def test_an_unsupported_extension_is_an_input_error(tmp_path: Path, name: str) -> None:
    path = tmp_path / name
    path.write_text("a,b\n1,2\n")
    with pytest.raises(InputFileError, match="unsupported file type") as caught:
        read(path)
    assert str(caught.value).startswith(f"{path}: ")


@pytest.mark.parametrize(
    ("name", "content", "says"),
    [
        ("empty.csv", b"", r"empty\.csv.*empty"),
        ("corrupt.parquet", b"PAR1 definitely not parquet", r"corrupt\.parquet.*cannot read Parquet"),
    ],
)
def test_an_unreadable_file_is_an_input_error_naming_it(
    tmp_path: Path, name: str, content: bytes, says: str
) -> None:
    path = tmp_path / name
    path.write_bytes(content)
    with pytest.raises(InputFileError, match=says):
        read(path)


def test_extension_is_case_insensitive_and_a_bom_is_ignored(tmp_path: Path) -> None:
    raw = table(("1", "x"))
    path = tmp_path / "IN.CSV"
    raw.to_csv(path, index=False, encoding="utf-8-sig")
    pd.testing.assert_frame_equal(read(path), raw)  # the first column is "a", not "\ufeffa"


def test_csv_is_read_as_stripped_strings_with_extra_columns_kept(tmp_path: Path) -> None:
    path = tmp_path / "in.csv"
    path.write_text(" a , b ,note\n 1 ,,NA\n  10.005 , x ,\n", encoding="utf-8")
    frame = read(path)
    assert list(frame.columns) == ["a", "b", "note"]
    assert frame["a"].tolist() == ["1", "10.005"]
    assert frame["b"].tolist() == ["", "x"]  # an empty cell is "", not NaN
    assert frame["note"].tolist() == ["NA", ""]  # not NaN: keep_default_na=False


@pytest.mark.parametrize("suffix", [".csv", ".parquet"])
def test_a_header_only_file_is_zero_rows_of_its_columns(tmp_path: Path, suffix: str) -> None:
    path = tmp_path / f"header{suffix}"
    if suffix == ".csv":
        path.write_text(",".join(COLUMNS) + "\n")
    else:
        table().to_parquet(path, index=False)
    frame = read(path)
    assert len(frame) == 0 and list(frame.columns) == COLUMNS


@pytest.mark.parametrize(
    ("header_suffix", "row_suffixes"),
    [
        ("", [",", ","]),  # a trailing comma on every data row
        (",", [",", ","]),  # ... and on the header too
        (",", ["", ""]),
        ("", [",,", ", ,"]),
        (",,", [",", ","]),
    ],
)
def test_trailing_empty_fields_written_on_every_row_are_ignored(
    tmp_path: Path, header_suffix: str, row_suffixes: list[str]
) -> None:
    # pandas took the first column as the index when every data row had one more field than the
    # header, shifting each value one column left (issue #14, defect 5).
    raw = table(("1", "x"), ("2", ""))
    header, *rows = lines(raw)
    path = tmp_path / "export.csv"
    text = [header + header_suffix, *(r + suffix for r, suffix in zip(rows, row_suffixes, strict=True))]
    path.write_text("\n".join(text) + "\n")
    pd.testing.assert_frame_equal(read(path), raw)


def test_rows_of_different_widths_are_refused_even_when_the_extra_field_is_empty(tmp_path: Path) -> None:
    # One row wider than its neighbours is a shift, not an export's trailing comma: "Smith, Ada"
    # unquoted pushes every later value right, and an empty last value makes the extra field empty.
    path = tmp_path / "comma.csv"
    path.write_text("a,b\n1,x\nSmith, Ada,\n")
    with pytest.raises(InputFileError, match=r"comma\.csv: line 3 has 3 fields.*line 2 has 2"):
        read(path)
    path.write_text("a,b\n1,x,\n2,y\n")
    with pytest.raises(InputFileError, match=r"comma\.csv: line 3 has 2 fields.*line 2 has 3"):
        read(path)


def test_a_short_row_rejects_the_file_naming_its_line(tmp_path: Path) -> None:
    # A missing field shifts every later value one column left; that is not a row a pipeline can
    # quarantine with sensible reasons (or, worse, might pass), so the file is refused with the line.
    path = tmp_path / "short.csv"
    path.write_text("a,b,c\n1,x,y\n2,x,y\n3,x\n")
    with pytest.raises(
        InputFileError, match=r"short\.csv: line 4 has 2 fields but the header names 3 columns"
    ) as caught:
        read_text_table(path, columns=["a", "b", "c"], required=["a", "b", "c"])
    assert "\n" not in str(caught.value) and caught.value.exit_code == 2


@pytest.mark.parametrize(
    ("row", "fields"),
    [
        ("2,Lovelace, Ada", 3),  # an unquoted comma inside the last value
        ("2,x,c,d,e", 5),
    ],
)
def test_a_value_past_the_last_column_rejects_the_file_naming_the_line(
    tmp_path: Path, row: str, fields: int
) -> None:
    path = tmp_path / "shifted.csv"
    path.write_text(f"a,b\n1,x\n{row}\n3,z\n")
    with pytest.raises(
        InputFileError,
        match=rf"shifted\.csv: line 3 has {fields} fields but the header names 2 columns;.*past the last",
    ) as caught:
        read(path)
    assert "\n" not in str(caught.value) and caught.value.exit_code == 2


def test_an_extra_value_past_the_last_column_names_its_physical_line(tmp_path: Path) -> None:
    raw = table(("1", "x"), ("2", "two\nlines"), ("3", "z"))
    header, *rows = raw.to_csv(index=False).rstrip("\n").split("\n")  # row 2 spans two lines
    rows[-1] += ",surprise"
    path = tmp_path / "extra.csv"
    path.write_text("\n".join([header, *rows]) + "\n")
    with pytest.raises(InputFileError, match=r"extra\.csv: line 5 has 3 fields .*past the last column"):
        read(path)


def test_a_repeated_csv_header_is_an_input_error(tmp_path: Path) -> None:
    path = tmp_path / "twice.csv"
    path.write_text("a,b,amount ,amount\n1,2,3,4\n")  # the same name once stripped
    with pytest.raises(InputFileError, match=r"twice\.csv: duplicate column names: amount"):
        read_text_table(path, columns=[*COLUMNS, "amount"], required=COLUMNS)
    path.write_text("a,b,amount,amount\n1,2,3,4\n")
    with pytest.raises(InputFileError, match=r"duplicate column names: amount$"):
        # named as the file spells it, not as pandas would rename it ("amount.1")
        read_text_table(path, columns=[*COLUMNS, "amount"], required=COLUMNS)


def test_a_repeated_parquet_column_is_an_input_error(tmp_path: Path) -> None:
    names = [*COLUMNS, "amount", "amount"]
    parquet = pa.Table.from_arrays(
        [pa.array(["1"]), pa.array(["2"]), pa.array(["3"]), pa.array(["4"])], names
    )
    path = tmp_path / "twice.parquet"
    pq.write_table(parquet, path)
    # pyarrow itself refuses such a file (or we do, if it ever stops refusing): either way, rejected.
    with pytest.raises(InputFileError, match=r"twice\.parquet: .*amount"):
        read_text_table(path, columns=[*COLUMNS, "amount"], required=COLUMNS)


@pytest.mark.parametrize("suffix", [".csv", ".pq"])
def test_missing_required_columns_are_named_with_the_file(tmp_path: Path, suffix: str) -> None:
    raw = pd.DataFrame({"a": ["1"], "note": ["x"]}, dtype="str")
    path = tmp_path / f"partial{suffix}"
    if suffix == ".csv":
        raw.to_csv(path, index=False)
    else:
        raw.to_parquet(path, index=False)
    schema = ["a", "b", "c"]
    with pytest.raises(InputFileError) as caught:
        read_text_table(path, columns=schema, required=schema)
    message = str(caught.value)
    assert f"partial{suffix}" in message
    assert message.startswith(f"{path}: missing required columns: b, c ")
    assert caught.value.exit_code == 2


@pytest.mark.parametrize("suffix", [".parquet", ".pq", ".PARQUET"])
def test_parquet_roundtrip(tmp_path: Path, suffix: str) -> None:
    raw = table(("1", "x"), ("2", ""), ("0.005", "2026-10-02T00:00:00Z"))
    path = tmp_path / f"in{suffix}"
    raw.to_parquet(path, index=False)
    pd.testing.assert_frame_equal(read(path), raw)


def test_parquet_columns_of_any_type_are_read_as_text(tmp_path: Path) -> None:
    parquet = pa.table(
        {
            "a": pa.array([Decimal("12.34")], pa.decimal128(10, 2)),
            "b": pa.array([10], pa.int64()),
            "at": pa.array([dt.datetime(2026, 10, 1, 10, tzinfo=dt.UTC)], pa.timestamp("us", tz="UTC")),
            "gone": pa.array([None], pa.timestamp("us")),
            "raw": pa.array([b"x-\xff"], pa.binary()),
        }
    )
    path = tmp_path / "typed.parquet"
    pq.write_table(parquet, path)
    frame = read(path)
    assert frame.to_dict("records") == [
        {"a": "12.34", "b": "10", "at": "2026-10-01 10:00:00.000000Z", "gone": "", "raw": "x-\ufffd"}
    ]
    assert all(pd.api.types.is_string_dtype(t) for t in frame.dtypes)
    assert bad_encoding(frame).tolist() == [True]  # the undecodable binary value


def test_bad_utf8_bytes_quarantine_only_their_row(tmp_path: Path) -> None:
    path = tmp_path / "in.csv"
    table(("1", "x"), ("2", "y"), ("3", "z")).to_csv(path, index=False)
    path.write_bytes(path.read_bytes().replace(b"2,y", b"2,\xff\xfey"))
    raw = read(path)
    assert raw["a"].tolist() == ["1", "2", "3"]  # the neighbours still go through
    assert raw["b"].tolist() == ["x", "\ufffd\ufffdy", "z"]
    checks = RowChecks(len(raw))
    checks.add("bad_encoding", bad_encoding(raw))
    assert checks.valid_rows({"a": raw["a"]}, {ROW_NUMBER: "int64", "a": "str"})["a"].tolist() == ["1", "3"]
    quarantined = checks.quarantine(raw)
    assert quarantined[REASONS].tolist() == ["bad_encoding"]
    assert quarantined[ROW_NUMBER].tolist() == [2]
    assert "\ufffd" in quarantined["b"].iloc[0]


@pytest.mark.parametrize(
    ("rows", "read", "column", "undecodable"),
    [
        (INVOICES, read_invoice_file, invoices.CUSTOMER_ID, b"CUS-\xff\xfe1"),
        (ACCOUNTS, read_legacy_file, accounts.NAME, b"J\xfcrgen"),
    ],
    ids=["refunds", "credit_migration"],
)
def test_bad_utf8_bytes_quarantine_only_their_row_through_each_pipelines_reader(
    tmp_path: Path, rows: RawRows, read: Callable[[Path], pd.DataFrame], column: str, undecodable: bytes
) -> None:
    """The test above, end to end: each pipeline's own reader and validation keep the promise."""
    rows.assert_undecodable_bytes_quarantine_only_their_row(tmp_path / "in.csv", read, column, undecodable)


# --- the row checks every validation shares -------------------------------------------------------


def test_a_frame_lacking_required_columns_is_an_input_error_naming_them() -> None:
    raw = pd.DataFrame({"a": ["1"]}, dtype="str")
    with pytest.raises(InputFileError) as caught:
        require_columns(raw, ["a", "b", "c"], "widget frame")
    assert str(caught.value) == "widget frame is missing required columns: b, c"
    assert caught.value.exit_code == 2
    with pytest.raises(InputFileError, match="widget frame is missing required columns: b, c"):
        text_columns(raw, ["a", "b", "c"], required=["a", "b", "c"], what="widget frame")


def test_non_string_columns_are_read_as_text() -> None:
    raw = pd.DataFrame({"a": [12.34], "b": [12], "note": [None]})
    col = text_columns(raw, [*COLUMNS, "note", "c"], required=COLUMNS, what="t", defaults={"c": "0"})
    assert {name: values.tolist() for name, values in col.items()} == {
        "a": ["12.34"],
        "b": ["12"],
        "note": [""],
        "c": ["0"],  # an optional column the frame lacks reads as its default
    }
    assert all(pd.api.types.is_string_dtype(values.dtype) for values in col.values())


def test_row_numbers_are_positional_even_with_a_foreign_index() -> None:
    raw = table(("1", "ok"), ("2", "nope"), ("3", "o\ufffdk"), ("4", "ok"))
    raw.index = pd.Index([10, 20, 30, 40])
    col = text_columns(raw, COLUMNS, required=COLUMNS, what="t")
    checks = RowChecks(len(raw))
    checks.add("nope", as_mask(col["b"] == "nope"))
    checks.add("bad_encoding", bad_encoding(raw))
    valid = checks.valid_rows(col, {ROW_NUMBER: "int64", "a": "str", "b": "str"})
    assert valid[ROW_NUMBER].tolist() == [1, 4]
    assert valid["a"].tolist() == ["1", "4"]
    assert valid.index.tolist() == [0, 1]
    quarantined = checks.quarantine(raw)
    assert quarantined[ROW_NUMBER].tolist() == [2, 3]
    assert quarantined[REASONS].tolist() == ["nope", "bad_encoding"]
    assert quarantined.index.tolist() == [0, 1]


def test_all_reasons_of_a_row_are_reported_in_the_order_checks_were_added() -> None:
    raw = table((" 1 ", "x"), ("2", "y"), ("3", " Z "))
    checks = RowChecks(len(raw))
    checks.add("zeta", np.array([True, False, True]))
    checks.add("alpha", np.array([True, False, False]))
    checks.add("never", np.array([False, False, False]))
    with pytest.raises(ValueError, match="check 'short' has 2 rows, the frame 3"):
        checks.add("short", np.array([True, False]))
    result = Validated(
        valid=checks.valid_rows({"a": raw["a"]}, {ROW_NUMBER: "int64", "a": "str"}),
        quarantined=checks.quarantine(raw),
    )
    assert result.valid[ROW_NUMBER].tolist() == [2]
    q = result.quarantined
    assert list(q.columns) == [*COLUMNS, ROW_NUMBER, REASONS]
    assert q[ROW_NUMBER].tolist() == [1, 3]
    assert q[REASONS].tolist() == ["zeta;alpha", "zeta"]  # the order added, not the alphabet
    assert q["a"].tolist() == [" 1 ", "3"] and q["b"].tolist() == ["x", " Z "]  # as given, not cleaned
    assert result.total_rows == len(raw) == len(result.valid) + len(q)
    assert result.reason_counts() == {"alpha": 1, "zeta": 2}
