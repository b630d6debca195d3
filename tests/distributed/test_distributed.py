"""Distributed execution end to end: `job run --executor celery` with real `job worker`s on RabbitMQ.

Both durable jobs run sharded on two workers; what they must leave at the provider is recomputed
from the batch ids and read from the simulator's store (never from a worker). The status JSON keeps
its shape: shard steps are folded into the step users know.
"""

from __future__ import annotations

import json
import re
from typing import Any

import pytest

from tests.crash.helpers import EXIT_OK, Expected, InstanceReader, assert_refunded_exactly_once
from tests.support.credits import CREDIT_STEPS, ProviderCredits, assert_credits_exact, expected_balances
from tests.support.polling import wait_until

from .conftest import Cluster

pytestmark = [pytest.mark.slow, pytest.mark.postgres]


def status_of(cluster: Cluster, batch_id: str) -> dict[str, Any]:
    p = cluster.job(["status", "--id", batch_id, "--json"])
    assert p.proc.returncode == EXIT_OK, p.tail()
    return dict(json.loads(p.stdout))


def test_a_credit_migration_runs_sharded_on_two_workers(cluster: Cluster, reader: InstanceReader) -> None:
    cluster.worker()
    cluster.worker()
    batch, size = "dist-credits-1", 200
    run = cluster.run("credit_migration", batch, size, shards=4)
    percents: list[float] = []

    def ended() -> bool:
        status = reader.status(batch)
        if status is not None:
            percents.append(status["percent_complete"])
        return run.proc.poll() is not None

    wait_until(ended, timeout=240, interval=0.1, what="the batch to end", detail=run.tail)
    assert run.proc.returncode == EXIT_OK, run.tail()
    assert percents == sorted(percents), percents  # the shards' counts add up, never go back
    _assert_sharded_progress_adds_up(reader, batch)

    status = status_of(cluster, batch)
    assert status["status"] == "succeeded", status
    assert [s["step_name"] for s in status["steps"]] == list(CREDIT_STEPS)
    assert [s["status"] for s in status["steps"]] == ["completed"] * len(CREDIT_STEPS), status["steps"]
    # A sharded step started once: its shards' start, not its merge's again.
    assert [s["executions"] for s in status["steps"]] == [1] * len(CREDIT_STEPS), status["steps"]
    expected = expected_balances([(batch, size)])
    stats = cluster.sim.quiet()
    assert stats["customers_created"] == len(expected)
    assert_credits_exact(ProviderCredits.of_store(cluster.sim.db), expected)
    # Both workers took part: the shards are spread, not run one after another on one worker.
    ran_on = {w.pid for w in cluster.workers if "execute_step" in w.stderr}
    assert len(ran_on) == 2, [w.tail() for w in cluster.workers]
    # The summary adds up the shards: one line per figure, the whole batch's.
    assert re.search(rf"customers created\s+{len(expected)}\n", run.stdout), run.stdout


def _assert_sharded_progress_adds_up(reader: InstanceReader, batch_id: str) -> None:
    """The progress events of each sharded step (what the SSE stream and `job run`'s lines show):
    ``done`` the shards' sum, never lower, and the step's fraction never lower, ending at its total."""
    from dagster import DagsterEventType

    from durable_assets.kit.progress import progress_from_event
    from durable_assets.ops.status import batch_runs

    sharded = {CREDIT_STEPS.index(name) + 1 for name in ("provider_customers", "applied_adjustments")}
    by_step: dict[int, list[tuple[int, int]]] = {}
    for run in batch_runs(reader.instance, batch_id):
        records = reader.instance.get_records_for_run(
            run.run_id, of_type=DagsterEventType.ENGINE_EVENT
        ).records
        for r in records:
            p = progress_from_event(r.event_log_entry.dagster_event)
            if p is not None and p.counted and p.step in sharded:
                by_step.setdefault(p.step, []).append((p.done, p.of))
    assert set(by_step) == sharded, by_step
    for step, counts in by_step.items():
        dones = [done for done, _of in counts]
        fractions = [done / of for done, of in counts]
        assert dones == sorted(dones) and fractions == sorted(fractions), (step, counts)
        assert counts[-1][0] == counts[-1][1], (step, counts)


def test_a_refund_batch_runs_sharded_and_waits_for_a_worker(cluster: Cluster) -> None:
    """Started before any worker of its queue: the run says so in its log, its steps wait in the
    queue, and the first worker to start runs them (workers of other queues do not count)."""
    batch, size = "dist-refunds-1", 400
    run = cluster.run("refund_batch", batch, size, shards=3)
    log = cluster.home / "logs" / f"{batch}.log"  # where `job run` sends Dagster's output
    wait_until(
        lambda: (
            (log.is_file() and "no `job worker` consumes queue" in log.read_text())
            or run.proc.poll() is not None
        ),
        timeout=120,
        what="the warning that no worker is there",
        detail=run.tail,
    )
    assert run.proc.poll() is None, run.tail()
    cluster.worker(concurrency=3)
    run.wait(240)
    assert run.proc.returncode == EXIT_OK, run.tail()
    status = status_of(cluster, batch)
    assert status["status"] == "succeeded", status
    assert all(s["status"] == "completed" for s in status["steps"]), status["steps"]
    cluster.sim.quiet()
    assert_refunded_exactly_once(cluster.sim.refunds(), Expected.of(batch, size))
