"""Synthetic legacy exports: deterministic, the same accounts every night, a few credits change,
and exactly the promised malformed rows."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from durable_assets.credit_migration import schema as s
from durable_assets.credit_migration.synthetic import (
    CHANGED_SHARE,
    account_credit_cents,
    legacy_account_id,
    synthetic_accounts,
    synthetic_mix,
)
from durable_assets.credit_migration.validation import read_legacy_file, validate_accounts
from tests.support.generators import (
    assert_file_roundtrip,
    assert_malformed_rows_quarantined,
    assert_sizes_checked,
)

ATTRIBUTES = [s.LEGACY_ACCOUNT_ID, s.EMAIL, s.NAME, s.CURRENCY]


@pytest.fixture(scope="module")
def batch() -> pd.DataFrame:
    return synthetic_accounts("credits-2026-10-01", 2000)


def _valid_by_id(frame: pd.DataFrame) -> pd.DataFrame:
    return validate_accounts(frame).valid.set_index(s.LEGACY_ACCOUNT_ID)


def test_same_batch_id_gives_an_identical_frame(batch: pd.DataFrame) -> None:
    pd.testing.assert_frame_equal(synthetic_accounts("credits-2026-10-01", 2000), batch)
    pd.testing.assert_frame_equal(synthetic_accounts("b", 50), synthetic_accounts("b", 50))


def test_shape_is_the_input_schema_all_text(batch: pd.DataFrame) -> None:
    assert list(batch.columns) == list(s.INPUT_COLUMNS)
    assert all(str(t) == "str" for t in batch.dtypes)
    assert not batch.isna().any().any()
    assert batch[s.LEGACY_ACCOUNT_ID].iloc[0] in ("LEG-0000001", "")  # row 1 may be broken on purpose
    assert legacy_account_id(42) == "LEG-0000042"


def test_accounts_are_the_same_in_every_batch_and_every_size(batch: pd.DataFrame) -> None:
    """Account n is one legacy account whatever the night: a migration must converge on it."""
    other = synthetic_accounts("credits-2026-10-02", 2000)
    smaller = synthetic_accounts("credits-2026-10-01", 500)
    a, b = _valid_by_id(batch), _valid_by_id(other)
    both = a.index.intersection(b.index)
    assert len(both) >= 1950
    cols = [c for c in ATTRIBUTES if c != s.LEGACY_ACCOUNT_ID]
    pd.testing.assert_frame_equal(a.loc[both, cols], b.loc[both, cols])
    # --size 500 holds the same first 500 accounts as --size 2000, with the same credits (which
    # rows are broken on purpose depends on the size, so compare the rows valid in both).
    small = _valid_by_id(smaller)
    common = small.index.intersection(a.index)
    assert len(common) >= 490 and set(small.index) <= {legacy_account_id(n) for n in range(1, 501)}
    pd.testing.assert_frame_equal(
        small.loc[common, [*cols, "credit_cents", s.UPDATED_AT]],
        a.loc[common, [*cols, "credit_cents", s.UPDATED_AT]],
    )
    # Rows are accounts 1..N in order, whichever of them is broken.
    ids = [legacy_account_id(n) for n in range(1, 2001)]
    intact = batch[s.LEGACY_ACCOUNT_ID].str.fullmatch(r"LEG-\d{7}")
    assert batch.loc[intact, s.LEGACY_ACCOUNT_ID].tolist() == [
        i for i, ok in zip(ids, intact, strict=True) if ok
    ]


def test_about_one_credit_in_ten_differs_from_the_accounts_usual_credit() -> None:
    """Each batch changes ~10% of credits; its usual (base) credit is what most nights hold."""
    numbers = np.arange(1, 20_001, dtype=np.int64)
    nights = np.stack([account_credit_cents(numbers, f"credits-2026-10-{d:02d}") for d in range(1, 8)])
    base = np.sort(nights, axis=0)[3]  # the value of at least 4 of 7 nights is the median
    for night in nights:
        share = float((night != base).mean())
        assert abs(share - CHANGED_SHARE) < 0.015, share


def test_two_batch_ids_differ_in_a_few_credits_only() -> None:
    """Between two nights, an account's credit differs if either night changed it: ~1-(0.9)^2."""
    numbers = np.arange(1, 20_001, dtype=np.int64)
    one = account_credit_cents(numbers, "credits-2026-10-01")
    two = account_credit_cents(numbers, "credits-2026-10-02")
    share = float((one != two).mean())
    assert 0.15 < share < 0.23, share
    assert np.array_equal(one, account_credit_cents(numbers, "credits-2026-10-01"))


def test_credits_are_in_range_and_some_are_zero(batch: pd.DataFrame) -> None:
    valid = validate_accounts(batch).valid
    credit = valid["credit_cents"]
    assert ((credit == 0) | credit.between(100, 50_000)).all()
    assert 0.05 < float((credit == 0).mean()) < 0.15  # customers with nothing to migrate
    assert set(valid[s.CURRENCY]) == set(s.ACCEPTED_CURRENCIES)


def test_credit_column_matches_the_pure_rule(batch: pd.DataFrame) -> None:
    valid = validate_accounts(batch).valid
    numbers = valid[s.LEGACY_ACCOUNT_ID].str.slice(4).astype("int64").to_numpy()
    expected = account_credit_cents(numbers, "credits-2026-10-01")
    assert valid["credit_cents"].tolist() == expected.tolist()


def test_mix_counts_sum_to_size() -> None:
    assert synthetic_mix(1000) == {"malformed": 10, "valid": 990}
    assert synthetic_mix(0) == {"malformed": 0, "valid": 0}
    assert synthetic_mix(49) == {"malformed": 0, "valid": 49}
    assert synthetic_mix(50) == {"malformed": 1, "valid": 49}  # half rounds up
    for size in (0, 1, 7, 13, 99, 150, 12345):
        assert sum(synthetic_mix(size).values()) == size


def test_validation_quarantines_exactly_the_malformed_rows(batch: pd.DataFrame) -> None:
    mix = synthetic_mix(len(batch))
    assert mix["malformed"] == 20
    assert mix["valid"] == 1980
    kinds = {
        "empty_legacy_account_id",
        "invalid_email",
        "unknown_currency",
        "negative_credit",
        "non_numeric_credit",
        "invalid_timestamp",
        "bad_encoding",
        "legacy_account_id_too_long",
    }
    assert_malformed_rows_quarantined(validate_accounts(batch), len(batch), mix["malformed"], kinds)


@pytest.mark.parametrize("size", [1, 2, 5, 13, 50, 101, 250])
def test_tiny_batches_quarantine_exactly_their_malformed_rows(size: int) -> None:
    frame = synthetic_accounts("tiny", size)
    assert len(frame) == size
    result = validate_accounts(frame)
    assert len(result.quarantined) == synthetic_mix(size)["malformed"]
    assert len(result.valid) == synthetic_mix(size)["valid"]


def test_which_rows_are_broken_depends_on_the_batch() -> None:
    one = validate_accounts(synthetic_accounts("credits-a", 1000)).quarantined[s.ROW_NUMBER]
    two = validate_accounts(synthetic_accounts("credits-b", 1000)).quarantined[s.ROW_NUMBER]
    assert len(one) == len(two) == 10 and set(one) != set(two)


def test_survives_a_csv_and_parquet_roundtrip(batch: pd.DataFrame, tmp_path: Path) -> None:
    assert_file_roundtrip(batch, read_legacy_file, tmp_path)


def test_size_zero_and_negative() -> None:
    assert_sizes_checked(synthetic_accounts, s.INPUT_COLUMNS)
