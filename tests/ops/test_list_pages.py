"""`job list` and `GET /runs` read one page: newest first, `--limit`, `--before`, `--all`, and a
line (or a `Link` header) for what follows. Batches are made as runs in the instance, as a year of
nightly batches would leave them, without running them."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from dagster import DagsterInstance

from durable_assets.definitions import refund_batch_job
from durable_assets.errors import UnknownBatchError
from durable_assets.kit.tags import BATCH_TAG
from durable_assets.ops.status import list_batches
from tests.conftest import job_cli


@pytest.fixture
def instance(dagster_home: Path) -> Iterator[DagsterInstance]:
    with DagsterInstance.get() as inst:
        yield inst


def _batch_run(instance: DagsterInstance, batch_id: str) -> None:
    """A run of batch ``batch_id`` (a second one for an existing batch: its re-execution)."""
    from dagster._core.execution.api import create_execution_plan

    job = refund_batch_job()
    config = {"ops": {"invoices": {"config": {"size": 5}}}}
    tags = {BATCH_TAG: batch_id, "dagster/partition": batch_id}
    instance.add_dynamic_partitions("batches", [batch_id])
    run = instance.create_run_for_job(
        job_def=job,
        execution_plan=create_execution_plan(job, config, tags=tags),
        run_config=config,
        tags=tags,
    )
    instance.report_run_failed(run, message="made by the test")


def test_pages_follow_the_newest_run_and_never_repeat_or_skip_a_batch(instance: DagsterInstance) -> None:
    for n in range(7):
        _batch_run(instance, f"night-{n}")
    _batch_run(instance, "night-2")  # re-executed last: the newest batch now

    first = list_batches(instance, limit=3)
    assert [b.id for b in first.batches] == ["night-2", "night-6", "night-5"]
    assert first.has_more and first.more == 4
    second = list_batches(instance, limit=3, before="night-5")
    assert [b.id for b in second.batches] == ["night-4", "night-3", "night-1"]
    assert second.has_more and second.more is None  # past the first page, only "more" is cheap to know
    last = list_batches(instance, limit=3, before="night-1")
    assert [b.id for b in last.batches] == ["night-0"] and not last.has_more and last.more == 0
    everything = list_batches(instance, limit=None)
    assert [b.id for b in everything.batches] == [
        "night-2",
        "night-6",
        "night-5",
        "night-4",
        "night-3",
        "night-1",
        "night-0",
    ]
    assert list_batches(instance, job="credit_migration").batches == []
    with pytest.raises(UnknownBatchError):
        list_batches(instance, before="no-such-night")
    assert list_batches(instance).batches == everything.batches  # 7 batches: under the default 50


def test_the_cli_says_how_many_more_and_how_to_read_them(instance: DagsterInstance) -> None:
    for n in range(3):
        _batch_run(instance, f"day-{n}")
    page = job_cli("list", "--limit", "2")
    assert page.returncode == 0, page.stderr
    assert [line.split()[0] for line in page.stdout.splitlines()] == ["day-2", "day-1"]
    assert "1 more batches: `job list --before day-1` for the next page, or --all" in page.stderr
    rest = job_cli("list", "--before", "day-1", "--json")
    assert rest.returncode == 0 and '"id": "day-0"' in rest.stdout and rest.stderr == ""
    assert job_cli("list", "--limit", "0").returncode == 2
    assert job_cli("list", "--limit", "2", "--all").returncode == 2
    assert job_cli("list", "--before", "nope").returncode == 3


def _statements(instance: DagsterInstance, **page: object) -> int:
    """The SQL statements one page of ``list_batches`` sends, read by an instance opened afresh (so
    nothing a previous read learnt about the run shards is kept)."""
    from sqlalchemy import event
    from sqlalchemy.engine import Engine

    count = 0

    def counted(*_args: object) -> None:
        nonlocal count
        count += 1

    with DagsterInstance.from_ref(instance.get_ref()) as fresh:
        event.listen(Engine, "before_cursor_execute", counted)
        try:
            list_batches(fresh, **page)  # type: ignore[arg-type]
        finally:
            event.remove(Engine, "before_cursor_execute", counted)
    return count


def test_a_page_reads_the_same_whatever_the_history(instance: DagsterInstance) -> None:
    """Issue #37: the reads of a page follow the page, not the instance's history (10 vs 100 batches
    send the same statements: the lineages in one query, each run's events in its own shard)."""
    from dagster._core.execution.api import create_execution_plan

    job = refund_batch_job()
    config = {"ops": {"invoices": {"config": {"size": 5}}}}
    plan = create_execution_plan(job, config)

    def nights(first: int, last: int) -> None:
        ids = [f"night-{n:03d}" for n in range(first, last)]
        instance.add_dynamic_partitions("batches", ids)
        for bid in ids:
            tags = {BATCH_TAG: bid, "dagster/partition": bid}
            run = instance.create_run_for_job(job_def=job, execution_plan=plan, run_config=config, tags=tags)
            instance.report_run_failed(run, message="made by the test")

    nights(0, 10)
    list_batches(instance, limit=5)  # the job's snapshot read once (its ID never changes what it says)
    few = _statements(instance, limit=5)
    nights(10, 100)
    many = _statements(instance, limit=5)
    assert many == few, f"a page of 5 sent {few} statements with 10 batches, {many} with 100"
    page = list_batches(instance, limit=5)
    assert [b.id for b in page.batches] == [f"night-{n:03d}" for n in range(99, 94, -1)]
    assert page.more == 95
