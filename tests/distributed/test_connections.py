"""Database connections stay within docs/scaling.md's bound while workers run a batch on Postgres.

Two `job worker --concurrency 4` (eight pool children) and a `job run --executor celery` of a
sharded refund batch, its connections counted from ``pg_stat_activity`` (the batch's own database)
throughout the run and once it ended. The bound is the formula the docs give, written out here, so
the test checks the documented number, not only what the code computes. Before the bound, a child
kept about 20 connections open after its task (74 for this test's cluster once its batch ended).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import pytest
import sqlalchemy as sa

from durable_assets.kit.db import one_task_at_a_time
from durable_assets.kit.settings import DistributedSettings
from tests.crash.helpers import EXIT_OK
from tests.support.polling import wait_until

from .conftest import Cluster

pytestmark = [pytest.mark.slow, pytest.mark.postgres]

WORKERS, CHILDREN, SHARDS = 2, 4, 8
#: The docs' formula (docs/scaling.md, "Database connections"), with DURABLE_WORKER_DB_POOL's default:
#: ours ``2 x pool``, and Dagster's three storages' ``3 x 2``, per pool child and per orchestrator.
POOL = DistributedSettings().worker_db_pool
PER_PROCESS = 2 * POOL + 6
#: What a child keeps open between tasks: ``pool`` of ours, and one each of Dagster's run and event
#: log storages (a task never uses the schedule storage).
KEPT = POOL + 2


@contextmanager
def connection_counter(pg_url: str) -> Iterator[sa.Connection]:
    driver_url = pg_url.replace("postgresql://", "postgresql+psycopg2://", 1)
    # Autocommit: a transaction would see one snapshot of pg_stat_activity throughout.
    engine = sa.create_engine(driver_url, poolclass=sa.NullPool, isolation_level="AUTOCOMMIT")
    try:
        with engine.connect() as conn:
            yield conn
    finally:
        engine.dispose()


def connections(conn: sa.Connection) -> int:
    """Client connections to this database now, the counter's own left out."""
    query = sa.text(
        "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND pid <> pg_backend_pid()"
    )
    return int(conn.execute(query).scalar_one())


def test_workers_and_their_orchestrator_hold_no_more_connections_than_documented(cluster: Cluster) -> None:
    assert one_task_at_a_time(POOL).most == PER_PROCESS  # the docs' formula is the code's
    bound = WORKERS * CHILDREN * PER_PROCESS + PER_PROCESS  # the parents hold none
    for _ in range(WORKERS):
        cluster.worker(concurrency=CHILDREN)
    run = cluster.run("refund_batch", "conn-1", 600, shards=SHARDS)
    seen: list[int] = []
    with connection_counter(cluster.pg_url) as conn:

        def ended() -> bool:
            seen.append(connections(conn))
            return run.proc.poll() is not None

        wait_until(ended, timeout=180, interval=0.05, what="the batch to end", detail=run.tail)
        assert run.proc.returncode == EXIT_OK, run.tail()
        assert max(seen) <= bound, (max(seen), bound, seen)
        # The orchestrator has exited; between tasks each child keeps only its few (8 x 4 here, where
        # the unbounded pools kept 74 for good). A task still ending as the run did (a superseded
        # re-send on a loaded machine) may hold more for a moment, so this waits for them to settle.
        kept_bound = WORKERS * CHILDREN * KEPT
        after: list[int] = []

        def settled() -> bool:
            after.append(connections(conn))
            return 0 < after[-1] <= kept_bound

        wait_until(
            settled,
            timeout=30,
            interval=0.1,
            what=f"the idle workers to keep at most {kept_bound} connections",
            detail=lambda: f"connections since the run ended: {after[-20:]}",
        )
    busy = sum(1 for w in cluster.workers if "execute_step" in w.stderr)
    assert busy == WORKERS, [w.tail() for w in cluster.workers]
