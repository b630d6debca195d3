"""A process's connections to our tables: bounded as `job worker`'s pool children need (kit/db.py).

A pool child's effect threads (16 by default) take turns on its few connections; none waits long
and none holds two, so the bound costs no failed statement.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import sqlalchemy as sa

from durable_assets.kit import db
from durable_assets.kit.db import THREADED, DurableDatabase, bound_connections, one_task_at_a_time


@pytest.fixture
def bounded() -> Iterator[None]:
    bound_connections(one_task_at_a_time(2))
    try:
        yield
    finally:
        bound_connections(THREADED)


def test_a_pool_child_keeps_two_of_ours_and_opens_at_most_two_more() -> None:
    bounds = one_task_at_a_time(2)
    assert (bounds.pool_size, bounds.max_overflow, bounds.dagster_overflow) == (2, 2, 1)
    assert bounds.most == 2 + 2 + 3 * 2  # docs/scaling.md's 2 x pool + 6
    assert THREADED.pool_size + THREADED.max_overflow >= 16 + 4  # DURABLE_CONCURRENCY's threads and 4 more


@pytest.mark.usefixtures("bounded")
def test_sixteen_threads_take_turns_on_a_bounded_pool(durable_db_url: str) -> None:
    database = DurableDatabase(durable_db_url)
    pool = database.engine.pool
    assert isinstance(pool, sa.QueuePool) and pool.size() == 2
    most, lock = [0], threading.Lock()

    def statement(i: int) -> int:
        with database.transaction() as conn:
            with lock:
                most[0] = max(most[0], pool.checkedout())
            return int(conn.execute(sa.select(sa.literal(i))).scalar_one())

    with ThreadPoolExecutor(16) as threads:
        assert sorted(threads.map(statement, range(400))) == list(range(400))
    assert 1 <= most[0] <= 4, most
    assert pool.checkedin() <= 2  # what it keeps once idle


def test_bounding_closes_what_the_process_held_before(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'durable.db'}"
    before = DurableDatabase(url).engine
    try:
        bound_connections(one_task_at_a_time(1))
        assert url not in db._engines  # a `job worker`'s parent holds nothing once its pool forks
        assert DurableDatabase(url).engine is not before
    finally:
        bound_connections(THREADED)
