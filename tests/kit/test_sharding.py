"""How a sharded step splits its rows: evenly for a new batch, as it always did for an old one.

A sharded step lasts as long as its largest shard, so new batches deal their distinct values out
in turn (``BALANCED``). A batch is split one way for its whole life: a resume re-runs only the
shards that did not finish and merges them with the stored ones, so the scheme is read from the
lineage's first run, and a first run without one (started before there was a choice) keeps CRC-32.
"""

from __future__ import annotations

import random
import uuid
import zlib

import pandas as pd
import pytest
from dagster import DagsterInstance, DagsterRun

from durable_assets.errors import UnknownShardSchemeError
from durable_assets.kit.sharding import (
    CURRENT_SCHEME,
    ShardScheme,
    rows_per_shard,
    scheme_of_batch,
    shard_numbers,
)
from durable_assets.kit.tags import SHARD_SCHEME_TAG


def _ids(n: int, seed: int) -> list[str]:
    rng = random.Random(seed)
    return [f"in_{rng.getrandbits(48):012x}" for _ in range(n)]


@pytest.mark.parametrize("n", [1, 2, 3, 4, 7, 16])
def test_balanced_shards_differ_by_at_most_one_row(n: int) -> None:
    for seed, rows in enumerate([0, 1, 5, 270, 1_001]):
        counts = rows_per_shard(pd.Series(_ids(rows, seed), dtype=object), n, ShardScheme.BALANCED)
        assert sum(counts) == rows
        assert max(counts) - min(counts) <= 1, (rows, counts)


def test_crc32_shards_vary_which_is_why_new_batches_do_not_use_it() -> None:
    spreads = [
        max(c) - min(c)
        for c in (rows_per_shard(pd.Series(_ids(270, seed)), 4, ShardScheme.CRC32) for seed in range(20))
    ]
    assert max(spreads) > 10, spreads  # e.g. 57 and 79 rows: the step waits on the largest


def test_crc32_is_the_split_batches_started_with_before_the_choice() -> None:
    """A batch started by an earlier release must resume with the split its finished shards used."""
    ids = _ids(500, 1)
    numbers = shard_numbers(pd.Series(ids), 4, ShardScheme.CRC32)
    assert list(numbers) == [zlib.crc32(i.encode()) % 4 for i in ids]


def test_a_balanced_split_depends_on_the_values_not_their_order() -> None:
    ids = _ids(300, 2)
    shuffled = random.Random(3).sample(ids, len(ids))
    first = dict(zip(ids, shard_numbers(pd.Series(ids), 4, ShardScheme.BALANCED), strict=True))
    second = dict(zip(shuffled, shard_numbers(pd.Series(shuffled), 4, ShardScheme.BALANCED), strict=True))
    assert first == second


def test_equal_values_share_a_shard() -> None:
    """Rows of one customer (the notices step groups by customer) stay in one shard."""
    values = [f"cus_{i % 37}" for i in range(400)] + [7, 7, 7]
    frame = pd.DataFrame({"customer": values})
    frame["shard"] = shard_numbers(frame["customer"], 4, ShardScheme.BALANCED)
    assert frame.groupby(frame["customer"].map(str))["shard"].nunique().max() == 1
    by_shard = frame.drop_duplicates("customer")["shard"].value_counts()
    assert by_shard.max() - by_shard.min() <= 1  # 38 distinct values over 4 shards


def _run(instance: DagsterInstance, tags: dict[str, str], root: DagsterRun | None = None) -> DagsterRun:
    run = DagsterRun(
        job_name="refund_batch",
        run_id=str(uuid.uuid4()),
        tags=tags,
        root_run_id=root.run_id if root else None,
        parent_run_id=root.run_id if root else None,
    )
    return instance.add_run(run)


def test_a_batch_splits_as_its_first_run_was_tagged_whatever_the_resume_says() -> None:
    with DagsterInstance.ephemeral() as instance:
        new = _run(instance, {SHARD_SCHEME_TAG: CURRENT_SCHEME.value})
        assert scheme_of_batch(instance, new) is ShardScheme.BALANCED
        resumed_on_older = _run(instance, {SHARD_SCHEME_TAG: ShardScheme.CRC32.value}, root=new)
        assert scheme_of_batch(instance, resumed_on_older) is ShardScheme.BALANCED

        old = _run(instance, {})  # started before a run said how it split
        assert scheme_of_batch(instance, old) is ShardScheme.CRC32
        resumed_on_newer = _run(instance, {SHARD_SCHEME_TAG: CURRENT_SCHEME.value}, root=old)
        assert scheme_of_batch(instance, resumed_on_newer) is ShardScheme.CRC32


def test_a_scheme_this_release_does_not_know_stops_the_shard() -> None:
    with DagsterInstance.ephemeral() as instance:
        newer = _run(instance, {SHARD_SCHEME_TAG: "by-weight-v9"})
        with pytest.raises(UnknownShardSchemeError, match="by-weight-v9"):
            scheme_of_batch(instance, _run(instance, {}, root=newer))
