"""A sharded step's progress adds up: ``of`` the step's total, ``done`` the sum of its shards', never back.

Shards of one step report at once from several workers. Each used to overwrite the batch's one
progress row, so done/of jumped between shards' own counts and percent_complete went back; here
the shards report interleaved (in random orders, and from threads at once) and every published
report is checked: the step's total from the first report on, done the running sum, never lower.
"""

from __future__ import annotations

import random
import threading
from collections.abc import Callable

import pytest

from durable_assets.kit.db import DurableDatabase
from durable_assets.kit.progress import Progress, ProgressStore, ShardOf
from durable_assets.kit.sharding import ShardScheme, rows_per_shard, shard_position
from tests.support.machine import scaled

STEP, TOTAL, LABEL = 4, 7, "Issuing refunds"


def _p(done: int, of: int) -> Progress:
    return Progress(STEP, TOTAL, LABEL, done, of)


def _shard_reports(k: int, n: int, of: int, step: int = 10) -> list[tuple[Progress, ShardOf]]:
    """What one shard's step sends, in order: its start, its runner's counts, its end."""
    shard = ShardOf("issued_refunds", k, n)
    counts = [*range(0, of, step), of]
    return [
        (_p(0, 0), shard),
        *((_p(done, of), shard) for done in counts),
        (_p(0, 0), ShardOf("issued_refunds", k, n, finished=True)),
    ]


def _interleave(
    streams: list[list[tuple[Progress, ShardOf]]], rng: random.Random
) -> list[tuple[Progress, ShardOf]]:
    """One random interleaving that keeps each shard's own order."""
    queues = [list(s) for s in streams]
    out = []
    while any(queues):
        q = rng.choice([q for q in queues if q])
        out.append(q.pop(0))
    return out


def _assert_never_back(seen: list[Progress], of: int) -> None:
    counted = [p for p in seen if p.counted]
    assert counted, seen
    assert {p.of for p in counted} == {of}, "of is the step's total from the first report on"
    dones = [p.done for p in counted]
    assert dones == sorted(dones), dones
    assert counted[-1].done == of


@pytest.mark.parametrize("seed", range(5))
def test_shards_reporting_interleaved_add_up_and_never_go_back(durable_db_url: str, seed: int) -> None:
    store = ProgressStore(DurableDatabase(durable_db_url))
    rows = [37, 25, 41, 0]
    store.expect_shards("b", "run-1", "issued_refunds", rows)
    published: list[Progress] = []
    streams = [_shard_reports(k, len(rows), n) for k, n in enumerate(rows)]
    for p, shard in _interleave(streams, random.Random(seed)):
        store.write_shard("b", "run-1", p, shard, published.append)
        latest = store.latest("b")
        assert latest is not None and latest == published[-1]
    _assert_never_back(published, sum(rows))


def test_a_shard_that_counts_less_than_its_rows_still_ends_the_step_at_its_total(durable_db_url: str) -> None:
    """Rows with nothing to do (held for review, already converged) leave the shard's count below its
    row count: the step's ``of`` shrinks to what is really counted, and the fraction only rises."""
    store = ProgressStore(DurableDatabase(durable_db_url))
    store.expect_shards("b", "run-1", "issued_refunds", [10, 10])
    published: list[Progress] = []
    streams = [_shard_reports(0, 2, 10, step=5), _shard_reports(1, 2, 0)]  # shard 1: no work at all
    for p, shard in [streams[0][0], streams[0][1], *streams[1], *streams[0][2:]]:
        store.write_shard("b", "run-1", p, shard, published.append)
    fractions = [p.done / p.of for p in published if p.counted]
    assert fractions == sorted(fractions), published
    assert published[-1] == _p(10, 10)


def test_a_re_executed_shard_does_not_take_back_what_it_had_done(durable_db_url: str) -> None:
    store = ProgressStore(DurableDatabase(durable_db_url))
    store.expect_shards("b", "run-1", "issued_refunds", [20, 20])
    shard0, shard1 = ShardOf("issued_refunds", 0, 2), ShardOf("issued_refunds", 1, 2)
    store.write_shard("b", "run-1", _p(20, 20), shard0)
    store.write_shard("b", "run-1", _p(0, 0), ShardOf("issued_refunds", 0, 2, finished=True))
    store.write_shard("b", "run-1", _p(12, 20), shard1)  # then its worker dies
    # The resume re-runs shard 1 only: it starts from 0 again, and settles its confirmed keys at once.
    store.expect_shards("b", "run-2", "issued_refunds", [20, 20])
    assert store.write_shard("b", "run-2", _p(0, 20), shard1) == _p(32, 40)
    assert store.write_shard("b", "run-2", _p(15, 20), shard1) == _p(35, 40)
    assert store.latest_of_run("b") == (_p(35, 40), "run-2")


def test_shards_writing_at_once_publish_their_sums_in_order(durable_db_url: str) -> None:
    """Four workers' reporters at once: the sums reach the row and the event log in the order taken."""
    db = DurableDatabase(durable_db_url)
    rows = [60, 60, 60, 60]
    ProgressStore(db).expect_shards("b", "run-1", "issued_refunds", rows)
    logged: list[Progress] = []
    log_lock = threading.Lock()

    def sink(p: Progress) -> None:
        with log_lock:
            logged.append(p)

    def shard(k: int) -> Callable[[], None]:
        def run() -> None:
            store = ProgressStore(db)
            for p, where in _shard_reports(k, len(rows), rows[k], step=3):
                store.write_shard("b", "run-1", p, where, sink)

        return run

    threads = [threading.Thread(target=shard(k)) for k in range(len(rows))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=scaled(120))
    assert not any(t.is_alive() for t in threads)
    _assert_never_back(logged, sum(rows))
    assert ProgressStore(db).latest("b") == _p(sum(rows), sum(rows))


def test_a_late_report_of_an_earlier_step_does_not_move_progress_back(durable_db_url: str) -> None:
    """A superseded shard that wakes up after the batch moved on to the next step."""
    store = ProgressStore(DurableDatabase(durable_db_url))
    store.write("b", "run-1", Progress(STEP + 1, TOTAL, "Sending notices", 3, 10))
    assert store.write_shard("b", "run-1", _p(5, 20), ShardOf("issued_refunds", 0, 2)) is None
    assert store.latest("b") == Progress(STEP + 1, TOTAL, "Sending notices", 3, 10)


def test_shard_names_and_row_counts() -> None:
    import pandas as pd

    assert shard_position("issued_refunds__shard_2_of_4") == ShardOf("issued_refunds", 2, 4)
    assert shard_position("issued_refunds") is None
    for scheme in ShardScheme:
        counts = rows_per_shard(pd.Series([f"inv_{i}" for i in range(1000)]), 4, scheme)
        assert sum(counts) == 1000 and all(counts), scheme
