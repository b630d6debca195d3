"""What every synthetic batch generator promises, checked the same way for each pipeline's.

A generator feeds demos, tests and the benchmark, so it must survive the file formats a user
would hand the job (CSV and Parquet read back as the same frame) and treat sizes as the CLI does
(0 is an empty batch with every column, a negative size is a usage error).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path

import pandas as pd
import pytest

from durable_assets.errors import UsageError
from durable_assets.kit.tables import REASONS, Validated


def assert_file_roundtrip(batch: pd.DataFrame, read: Callable[[Path], pd.DataFrame], folder: Path) -> None:
    """The pipeline's own reader gives back ``batch`` from a CSV and from a Parquet file."""
    for path, write in ((folder / "b.csv", batch.to_csv), (folder / "b.parquet", batch.to_parquet)):
        write(path, index=False)
        pd.testing.assert_frame_equal(read(path), batch)


def assert_sizes_checked(generate: Callable[[str, int], pd.DataFrame], columns: Sequence[str]) -> None:
    empty = generate("b", 0)
    assert list(empty.columns) == list(columns)
    assert empty.empty
    with pytest.raises(UsageError, match="size must be >= 0"):
        generate("b", -1)


def assert_malformed_rows_quarantined(result: Validated, total: int, malformed: int, kinds: set[str]) -> None:
    """Validation of a synthetic batch of ``total`` rows quarantines exactly its ``malformed`` ones,
    each for one defect, and every kind of defect the generator makes (``kinds``) shows up."""
    assert len(result.quarantined) == malformed
    assert len(result.valid) == total - malformed
    assert not result.quarantined[REASONS].str.contains(";").any()
    assert set(result.reason_counts()) == kinds
