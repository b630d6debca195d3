"""Synthetic invoices: determinism, disjoint ids across batches, and the promised mix of problems."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pandas as pd
import pytest

from durable_assets.refunds import schema as s
from durable_assets.refunds.policy import compute_refund_candidates
from durable_assets.refunds.synthetic import batch_prefix, synthetic_invoices, synthetic_mix
from durable_assets.refunds.validation import read_invoice_file, validate_invoices
from tests.support.generators import (
    assert_file_roundtrip,
    assert_malformed_rows_quarantined,
    assert_sizes_checked,
)


@pytest.fixture(scope="module")
def batch() -> pd.DataFrame:
    return synthetic_invoices("batch-2026-10", 2000)


def test_same_batch_id_gives_an_identical_frame(batch: pd.DataFrame) -> None:
    pd.testing.assert_frame_equal(synthetic_invoices("batch-2026-10", 2000), batch)


def test_different_batch_ids_never_share_invoice_ids(batch: pd.DataFrame) -> None:
    other = synthetic_invoices("batch-2026-11", 2000)
    assert set(other[s.INVOICE_ID]).isdisjoint(batch[s.INVOICE_ID])
    assert not other.equals(batch)


def test_invoice_ids_embed_the_batch_hash(batch: pd.DataFrame) -> None:
    prefix = hashlib.sha256(b"batch-2026-10").hexdigest()[:10]
    assert batch_prefix("batch-2026-10") == prefix
    assert batch[s.INVOICE_ID].iloc[0] == f"INV-{prefix}-0000001"
    assert batch[s.INVOICE_ID].iloc[-1] == f"INV-{prefix}-0002000"
    assert batch[s.INVOICE_ID].is_unique


def test_determinism_holds_for_every_size() -> None:
    pd.testing.assert_frame_equal(synthetic_invoices("b", 50), synthetic_invoices("b", 50))
    assert synthetic_invoices("b", 50)[s.INVOICE_ID].str.startswith(f"INV-{batch_prefix('b')}-").all()


def test_shape_is_the_input_schema_all_text_without_charges(batch: pd.DataFrame) -> None:
    assert list(batch.columns) == list(s.INPUT_COLUMNS)
    assert all(str(t) == "str" for t in batch.dtypes)
    assert (batch[s.CHARGE_ID] == "").all()
    assert not batch.isna().any().any()


def test_mix_counts_sum_to_size() -> None:
    assert synthetic_mix(1000) == {
        "duplicate_charge": 80,
        "overcharge": 60,
        "charged_after_cancellation": 40,
        "malformed": 10,
        "clean": 810,
    }
    for size in (0, 1, 7, 13, 99, 12345):
        assert sum(synthetic_mix(size).values()) == size


def test_validation_quarantines_exactly_the_malformed_rows(batch: pd.DataFrame) -> None:
    mix = synthetic_mix(len(batch))
    assert mix["malformed"] == 20
    kinds = {
        "negative_amount:amount_charged",
        "unknown_currency",
        "invalid_email",
        "invalid_timestamp:charged_at",
        "non_numeric_amount:amount_charged",
        "refunded_exceeds_charged",
        "missing_customer_id",
        "bad_encoding",
    }
    assert_malformed_rows_quarantined(
        validate_invoices(batch, require_charge_id=False), len(batch), mix["malformed"], kinds
    )


def test_with_charge_ids_required_every_row_is_quarantined(batch: pd.DataFrame) -> None:
    """Files must name the charge; a synthetic frame before charge creation does not."""
    result = validate_invoices(batch.head(50))
    assert result.valid.empty
    assert result.quarantined[s.REASONS].str.contains("missing_charge_id").all()


def test_policy_finds_exactly_the_planted_problems(batch: pd.DataFrame) -> None:
    valid = validate_invoices(batch, require_charge_id=False).valid
    candidates = compute_refund_candidates(valid)
    mix = synthetic_mix(len(batch))
    assert candidates["reason"].value_counts().to_dict() == {
        "duplicate_charge": mix["duplicate_charge"],
        "overcharge": mix["overcharge"],
        "charged_after_cancellation": mix["charged_after_cancellation"],
    }
    assert (candidates["refund_cents"] <= candidates["refundable_cents"]).all()
    assert candidates["refund_cents"].min() >= 1
    assert candidates["refund_cents"].max() <= 50_000


def test_amounts_and_currencies_are_in_range(batch: pd.DataFrame) -> None:
    valid = validate_invoices(batch, require_charge_id=False).valid
    assert valid[s.AMOUNT_CHARGED_CENTS].between(500, 50_000).all()
    assert valid[s.CONTRACTED_CENTS].between(500, 50_000).all()
    assert set(valid[s.CURRENCY]) == set(s.ACCEPTED_CURRENCIES)
    assert (valid[s.ALREADY_REFUNDED_CENTS] <= valid[s.AMOUNT_CHARGED_CENTS]).all()


def test_survives_a_csv_and_parquet_roundtrip(batch: pd.DataFrame, tmp_path: Path) -> None:
    assert_file_roundtrip(batch, read_invoice_file, tmp_path)


def test_size_zero_and_negative() -> None:
    assert_sizes_checked(synthetic_invoices, s.INPUT_COLUMNS)


@pytest.mark.parametrize("size", [1, 2, 5, 13, 101])
def test_tiny_batches_are_consistent(size: int) -> None:
    frame = synthetic_invoices("tiny", size)
    assert len(frame) == size
    result = validate_invoices(frame, require_charge_id=False)
    assert len(result.quarantined) == synthetic_mix(size)["malformed"]
    candidates = compute_refund_candidates(result.valid)
    assert (candidates["reason"] == "duplicate_charge").sum() == synthetic_mix(size)["duplicate_charge"]
