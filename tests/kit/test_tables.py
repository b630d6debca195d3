"""kit/tables.py's refusals say what is wrong with the file, in words a person reads (#23)."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest

from durable_assets.errors import InputFileError
from durable_assets.kit.tables import read_text_table

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
