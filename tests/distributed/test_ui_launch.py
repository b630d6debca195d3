"""Distributed runs launched as the Dagster UI launches them, and their automatic resume.

A launch from the UI (GraphQL ``launchRun``, what the launchpad sends) goes through the queued run
coordinator, the daemon's run queue and our run launcher, whose run worker loads the code location
and executes its job. These tests prove that such a run, given the launchpad's executor config
(``execution: {config: {celery: {}}}``) or the run tag ``durable/executor=celery``, runs each step
as a Celery task on a real `job worker` (the task's own engine event names the worker), and that a
lost one is resumed by the daemon's automatic resume on the workers again, every refund exactly
once at the provider.

``DURABLE_TEST_REPEAT=10`` runs the crash case 10 times in one session.
"""

from __future__ import annotations

import json
import os
import re
import time
from pathlib import Path

import pytest
from dagster import DagsterEventType, DagsterInstance

from durable_assets.kit.executor import execution_config
from durable_assets.kit.modes import ExecutorKind
from durable_assets.kit.tags import (
    AUTO_RESUME_OF_TAG,
    AUTO_RESUMED_BY_TAG,
    EXECUTOR_TAG,
    WORKER_LOST_TAG,
)
from tests.crash.helpers import EXIT_OK, Expected, InstanceReader, assert_refunded_exactly_once
from tests.crash.lost_host import LostHost
from tests.support.dagster_dev import CodeServer, DagsterDev
from tests.support.polling import wait_until

from .conftest import Cluster

pytestmark = [pytest.mark.slow, pytest.mark.postgres]

REPEAT = int(os.environ.get("DURABLE_TEST_REPEAT", "1"))
#: The refund job's partitions (a UI launch adds the batch as a partition first).
PARTITIONS = "batches"
CELERY = execution_config(ExecutorKind.CELERY)


def steps_run_on_workers(instance: DagsterInstance, run_id: str) -> dict[str, str]:
    """step key -> the worker whose task executed it in this run (the task's own engine event)."""
    found: dict[str, str] = {}
    for entry in instance.all_logs(run_id, of_type=DagsterEventType.ENGINE_EVENT):
        match = re.match(r"Executing step (\S+) in worker (\S+) ", entry.message)
        if match:
            found[match.group(1)] = match.group(2)
    return found


def steps_started(instance: DagsterInstance, run_id: str) -> set[str]:
    return {
        e.step_key
        for e in instance.all_logs(run_id, of_type=DagsterEventType.STEP_START)
        if e.step_key is not None
    }


def succeeded(reader: InstanceReader, batch_id: str) -> dict | None:
    status = reader.status(batch_id)
    return status if status is not None and status["status"] == "succeeded" else None


@pytest.mark.timeout(600)
def test_ui_launches_run_their_steps_on_a_worker(
    cluster: Cluster, reader: InstanceReader, tmp_path: Path
) -> None:
    worker = cluster.worker()
    dev = DagsterDev(cluster.home, cluster.env(), tmp_path)
    size = 150
    by_config, by_tag = "ui-celery-config", "ui-celery-tag"
    try:
        dev.start()
        reader.instance.add_dynamic_partitions(PARTITIONS, [by_config, by_tag])
        runs = {
            by_config: dev.launch(by_config, size, run_config=CELERY),
            by_tag: dev.launch(by_tag, size, tags={EXECUTOR_TAG: ExecutorKind.CELERY.value}),
        }
        for batch in runs:
            wait_until(
                lambda b=batch: succeeded(reader, b),
                timeout=300,
                interval=0.25,
                what=f"batch {batch} to succeed",
                detail=lambda: f"{dev.proc.tail()}\n{worker.tail()}",
            )
    finally:
        dev.stop()
    instance = reader.instance
    worker_name = f"durable-{worker.pid}@"
    for batch, run_id in runs.items():
        run = instance.get_run_by_id(run_id)
        assert run is not None and run.job_name == "refund_batch"
        # However it was chosen, the run says it is distributed: runtime, status and resumes read it.
        assert run.tags[EXECUTOR_TAG] == ExecutorKind.CELERY.value, run.tags
        ran = steps_run_on_workers(instance, run_id)
        started = steps_started(instance, run_id)
        assert started and set(ran) == started, (ran, started)  # every step was a task, none ran in place
        assert all(w.startswith(worker_name) for w in ran.values()), (worker_name, ran)
        assert_refunded_exactly_once(cluster.sim.refunds(), Expected.of(batch, size))
        # The operations layer reads it like any run of the job.
        status = cluster.job(["status", "--id", batch, "--json"])
        assert status.proc.returncode == EXIT_OK, status.tail()
        as_json = json.loads(status.stdout)
        assert as_json["job"] == "refund_batch" and as_json["status"] == "succeeded", as_json
        assert {s["status"] for s in as_json["steps"]} == {"completed"}, as_json["steps"]
    assert "execute_step" in worker.stderr


@pytest.mark.timeout(600)
@pytest.mark.parametrize("repeat", range(REPEAT), ids=lambda i: f"run{i + 1}")
def test_a_lost_ui_launched_distributed_run_is_resumed_on_the_workers(
    cluster: Cluster, reader: InstanceReader, tmp_path: Path, repeat: int
) -> None:
    """The orchestrator's host (the run worker with its code server) is SIGKILLed mid refunds; the
    `job worker` lives on. Run monitoring fails the run, Dagster's retry is dropped (the location
    is unreachable), and once the code server is back the automatic resume re-executes the batch
    from failure with the same executor: its remaining steps are tasks on the worker again."""
    batch, size = "ui-celery-lost", 400
    # ~120 refunds at 100 ms, 2 at a time in the task: the kill lands inside the refund step.
    cluster.sim.configure(latency_ms=100)
    worker = cluster.worker()
    env = cluster.env(DURABLE_CONCURRENCY=2, DURABLE_AUTO_RESUME_AFTER_S=2, DURABLE_AUTO_RESUME_INTERVAL_S=1)
    code = CodeServer(env, tmp_path)
    dev = DagsterDev(cluster.home, env, tmp_path, code_server=code)
    started = time.monotonic()
    try:
        host = LostHost(reader, dev, code, batch)
        host.launch(PARTITIONS, size, run_config=CELERY)
        host.wait_mid_effects(
            lambda: bool(cluster.sim.stats()["refunds_created"]), "refunds from the worker's task"
        )
        at_kill = cluster.sim.stats()["refunds_created"]
        host.kill()
        back = host.recover()
    finally:
        dev.stop(grace_s=5)
        code.stop()
    print(f"\n{back.timeline()}; {at_kill} refunds at the kill; case {time.monotonic() - started:.1f} s")
    instance = reader.instance
    failed, resumed = back.failed, back.resumed
    assert (
        failed.tags[WORKER_LOST_TAG] == "lease_expired" and failed.tags[AUTO_RESUMED_BY_TAG] == resumed.run_id
    )
    assert resumed.tags[AUTO_RESUME_OF_TAG] == failed.run_id
    # Resumed as it was launched: the same executor, the steps left were tasks on the worker.
    assert resumed.tags[EXECUTOR_TAG] == ExecutorKind.CELERY.value, resumed.tags
    assert resumed.run_config.get("execution") == CELERY["execution"], resumed.run_config
    ran = steps_run_on_workers(instance, resumed.run_id)
    started_steps = steps_started(instance, resumed.run_id)
    assert started_steps and set(ran) == started_steps, (ran, started_steps)
    assert all(w.startswith(f"durable-{worker.pid}@") for w in ran.values()), ran
    assert 0 < at_kill < Expected.of(batch, size).n
    assert cluster.sim.quiet()["refunds_created"] == Expected.of(batch, size).n
    assert_refunded_exactly_once(cluster.sim.refunds(), Expected.of(batch, size))
    assert back.status["auto_resume"]["run_ids"] == [resumed.run_id], back.status
