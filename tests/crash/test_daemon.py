"""Slow tier: the daemon path. A batch launched as the UI launches it, whose worker is SIGKILLed, is
failed by Dagster's run monitoring (through our lease-aware launcher) and re-executed from failure
by run retries, with no CLI involved and no refund doubled.
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest
from dagster import DagsterRunStatus, RunsFilter

from durable_assets.kit.leases import owner_pid
from durable_assets.kit.tags import BATCH_TAG, WORKER_LOST_TAG
from tests.support.dagster_dev import DagsterDev
from tests.support.machine import scaled
from tests.support.polling import wait_until

from .helpers import (
    Expected,
    Simulator,
    assert_batch_complete,
    assert_refunded_exactly_once,
    instance_reader,
    job_env,
    notices_for,
)
from .lost_host import diagnose, parent_pid

pytestmark = pytest.mark.slow


def test_daemon_fails_dead_worker_and_retries_from_failure(home: Path, tmp_path: Path) -> None:
    batch, size, ttl = "daemon-path", 400, 2.0
    expected = Expected.of(batch, size)
    # ~120 refunds at 100 ms, 2 at a time: the refund step lasts seconds, so the kill lands inside it
    # even when the machine is slow to notice the first refund.
    sim = Simulator(tmp_path / "simulator.db", latency_ms=100)
    env = job_env(home, payments_url=sim.url, lease_ttl_s=ttl, DURABLE_CONCURRENCY=2)
    dev = DagsterDev(home, env, tmp_path)
    try:
        with instance_reader(home) as reader:
            dev.start()
            instance = reader.instance
            instance.add_dynamic_partitions("batches", [batch])
            first_run = dev.launch(batch, size)

            def worker_mid_refunds() -> object:
                run = instance.get_run_by_id(first_run)
                assert run is not None and not run.is_finished, f"run ended before the kill: {run}"
                lease = reader.lease(batch)
                mine = lease is not None and lease.run_id == first_run
                return lease if mine and sim.stats()["refunds_created"] else None

            def run_status() -> DagsterRunStatus:
                run = instance.get_run_by_id(first_run)
                assert run is not None
                return run.status

            lease = wait_until(worker_mid_refunds, timeout=180, interval=0.02, what="refunds from the worker")
            worker = owner_pid(lease.owner)
            # Nothing on the worker's host may report its death: a live code server notices its
            # child's SIGKILL and fails the run itself, a dead host reports nothing. Freeze the
            # code server (as if its host were gone) so that only the lease can tell; thaw it
            # once the run is failed, so the retry can load the code again.
            code_server = parent_pid(worker)
            os.kill(code_server, signal.SIGSTOP)
            try:
                at_kill = reader.status(batch)
                os.kill(worker, signal.SIGKILL)
                killed_at = time.monotonic()
                try:
                    wait_until(
                        lambda: run_status() == DagsterRunStatus.FAILURE,
                        timeout=90,
                        what="monitoring to fail the run",
                    )
                except AssertionError as exc:
                    raise AssertionError(
                        f"{exc}\n{diagnose(instance, first_run)}\n{dev.proc.tail()}"
                    ) from None
                detected = time.monotonic() - killed_at
            finally:
                os.kill(code_server, signal.SIGCONT)
            try:
                retries = wait_until(
                    lambda: instance.get_runs(RunsFilter(tags={"dagster/parent_run_id": first_run})),
                    timeout=120,
                    what="run retries to re-execute the run",
                )
            except AssertionError as exc:
                raise AssertionError(f"{exc}\n{diagnose(instance, first_run)}\n{dev.proc.tail()}") from None
            retried = time.monotonic() - killed_at
            wait_until(
                lambda: (st := reader.status(batch)) is not None and st["status"] == "succeeded",
                timeout=240,
                interval=0.25,
                what="the retried batch to succeed",
            )
            status = reader.status(batch)
            failed = instance.get_run_by_id(first_run)
        print(f"\ndead worker detected after {detected:.1f} s, re-executed after {retried:.1f} s")
        # Detection: the lease lapses within one TTL of the kill, monitoring sees it on its next poll.
        assert detected <= ttl + dev.poll_interval_s + scaled(10), detected  # 10 s of slack, scaled
        assert failed is not None and failed.tags.get(WORKER_LOST_TAG) == "lease_expired"
        assert failed.tags.get(BATCH_TAG) == batch, "the launcher tags UI-launched runs with their batch"
        assert retries[0].tags.get(BATCH_TAG) == batch
        assert at_kill is not None and at_kill["steps"][3]["status"] == "in_progress", at_kill["steps"]
        assert status is not None
        assert_batch_complete(status, home, batch)
        assert [s["executions"] for s in status["steps"]][:4] == [1, 1, 1, 2], status["steps"]
        assert sim.quiet()["refunds_created"] == expected.n
        assert_refunded_exactly_once(sim.refunds(), expected)
        assert notices_for(home, expected) == expected.n
    finally:
        dev.stop()
        sim.close()
