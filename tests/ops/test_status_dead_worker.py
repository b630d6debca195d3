"""`job status` sees a dead worker (issue #23, item 2), against a real `job run` killed with SIGKILL.

Before: 20 s after `kill -9` with a 15 s lease, status still said `running (45.6%)`; `job cancel`
then left it `canceling` for good. Now a batch whose run Dagster still calls running but whose lease
has lapsed, or whose worker process is gone from this host, reads as failed (worker lost), with the
step it stopped at and `job resume` advice, and a
cancel of it reads as canceled; both derived, never written: Dagster's run storage keeps the run as
the dead worker left it until `job resume` takes over, which still finishes the batch.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest
from dagster import DagsterRunStatus

from durable_assets.ops.events import BatchEventFeed
from tests.crash.helpers import EXIT_OK, JobProcess, instance_reader, job, job_env
from tests.support.homes import make_home
from tests.support.machine import scaled
from tests.support.polling import wait_until

pytestmark = pytest.mark.slow

#: Long: the worker is a process of this host, so its death must be seen well before the lease lapses.
LEASE_TTL_S = 60.0
#: How long after the kill the status may take to say failed: a loaded machine's reads.
DETECT_WITHIN_S = 15.0
EXIT_NEEDS_REVIEW = 4


def _running_step(st: dict[str, Any] | None) -> int | None:
    running = [s["step"] for s in (st or {}).get("steps", []) if s["status"] == "in_progress"]
    return running[-1] if running else None


def _cli_json(args: list[str], env: dict[str, str], logs: Path) -> Any:
    p = job([*args, "--json"], env, logs, timeout=60)
    assert p.proc.returncode == EXIT_OK, p.tail()
    return json.loads(p.stdout)


def test_a_killed_worker_reads_as_failed_then_canceled_and_resume_finishes_it(tmp_path: Path) -> None:
    home = make_home(tmp_path)
    env = job_env(home, lease_ttl_s=LEASE_TTL_S)
    slow = job_env(home, lease_ttl_s=LEASE_TTL_S, DURABLE_STEP_DELAY_S=1.5)
    worker = JobProcess(["run", "--id", "d1", "--size", "60"], slow, tmp_path)
    with instance_reader(home) as reader:
        wait_until(
            lambda: _running_step(reader.status("d1")) == 3 or worker.proc.poll() is not None,
            timeout=120,
            what="step 3 to start",
        )
        assert worker.proc.poll() is None, worker.tail()
        killed_at = worker.sigkill()
        worker.reap_group()
        run_id = reader.status("d1")["run_ids"][-1]  # type: ignore[index]

        # The worker was a process of this host: its death is known before its lease lapses.
        st = wait_until(
            lambda: (s := reader.status("d1")) is not None and s["status"] == "failed" and s,
            timeout=DETECT_WITHIN_S,
            what="status to say failed once the worker is gone",
        )
        assert time.monotonic() - killed_at <= scaled(DETECT_WITHIN_S) + 1
        assert [s["status"] for s in st["steps"]] == ["completed", "completed", "failed"] + ["pending"] * 4
        stopped = st["steps"][2]
        assert "worker" in stopped["error"] and "was lost" in stopped["error"], stopped
        assert "no longer exists on this host" in stopped["error"], stopped
        assert "`job resume --id d1`" in stopped["error"], stopped
        assert st["progress"]["step"] == 3
        assert st["progress"]["label"] == "Failed (worker lost): Computing refund candidates", st["progress"]
        assert st["percent_complete"] == round(100 * 2 / 7, 1)
        # Derived, not written: Dagster still holds the run as the dead worker left it.
        run = reader.instance.get_run_by_id(run_id)
        assert run is not None and run.status == DagsterRunStatus.STARTED

        # The event stream of `job serve` ends too, with the status `job status` shows: without it a
        # client following the batch would wait forever on a run Dagster still calls started.
        feed = BatchEventFeed(reader.instance, "d1")
        events: list[Any] = []

        def stream_ended() -> bool:
            batch, ended = feed.poll()
            events.extend(batch)
            return ended

        wait_until(stream_ended, timeout=DETECT_WITHIN_S, what="the event stream to end")
        last = events[-1]
        assert last.event == "status" and last.data["status"] == "failed", last
        assert "was lost" in last.data["error"] and "`job resume --id d1`" in last.data["error"], last
        assert last.data["run_id"] == run_id
        assert [e.id for e in events] == sorted({e.id for e in events}), "ids increase, none repeats"
        assert [e.data["status"] for e in events if e.event == "status"] == ["running", "failed"]

    # The CLI and the list say the same, in every form.
    assert _cli_json(["status", "--id", "d1"], env, tmp_path)["status"] == "failed"
    human = job(["status", "--id", "d1"], env, tmp_path, timeout=60).stdout
    assert "batch d1 (refund_batch): failed (28.6%)" in human, human
    assert "ended: step 3/7 Failed (worker lost): Computing refund candidates" in human, human
    assert "continue with `job resume --id d1`" in human, human
    [listed] = _cli_json(["list"], env, tmp_path)
    assert listed["id"] == "d1" and listed["status"] == "failed"
    assert "Failed (worker lost)" in listed["progress"]["label"]
    assert " failed " in job(["list"], env, tmp_path, timeout=60).stdout

    # A cancel of the dead batch: no worker will ever stop it, so it is canceled at once (#23).
    cancel = job(["cancel", "--id", "d1"], env, tmp_path, timeout=60)
    assert cancel.proc.returncode == EXIT_OK, cancel.tail()
    assert cancel.stdout.strip() == "batch d1: canceled", cancel.tail()
    with instance_reader(home) as reader:
        written = reader.instance.get_run_by_id(run_id)
        assert written is not None and written.status == DagsterRunStatus.CANCELED
    st = _cli_json(["status", "--id", "d1"], env, tmp_path)
    assert st["status"] == "canceled", st
    assert [s["status"] for s in st["steps"]][:4] == ["completed", "completed", "skipped", "pending"]
    assert st["progress"]["label"] == "Canceled (worker lost): Computing refund candidates"
    assert "`job resume --id d1`" in st["steps"][2]["error"]

    assert (
        job(["cancel", "--id", "d1"], env, tmp_path, timeout=60).stdout.strip()
        == "batch d1: already finished"
    )

    # `job resume` still takes the dead run over and finishes the batch.
    resumed = job(["resume", "--id", "d1"], env, tmp_path, timeout=180)
    assert resumed.proc.returncode in (EXIT_OK, EXIT_NEEDS_REVIEW), resumed.tail()
    st = _cli_json(["status", "--id", "d1"], env, tmp_path)
    assert st["status"] == "succeeded" and st["percent_complete"] == 100.0
    assert len(st["run_ids"]) == 2 and all(s["error"] is None for s in st["steps"])
    with instance_reader(home) as reader:
        dead = reader.instance.get_run_by_id(run_id)
        assert dead is not None and dead.status == DagsterRunStatus.CANCELED  # `job cancel` recorded it


def test_a_run_that_has_not_taken_its_lease_stays_queued_until_its_creator_s_lease_lapses(
    tmp_path: Path,
) -> None:
    """No lease yet is not a dead worker: a run created but not started stays queued. A `job run`
    that died right after creating its run leaves the lease it took for it ("pending"): once that
    lapses, the run is as dead as `job resume` takes it to be. (A daemon-queued run needs a code
    location to create; it never counts as dead before it starts.)"""
    from durable_assets.kit.db import DurableDatabase
    from durable_assets.kit.leases import LeaseStore
    from durable_assets.ops.reexecution import batch_tags
    from durable_assets.ops.registry import durable_jobs

    home = make_home(tmp_path)
    with instance_reader(home) as reader:
        job_def = durable_jobs().job_definition("refund_batch")
        reader.instance.add_dynamic_partitions(durable_jobs().default.partitions_name, ["q1"])
        reader.instance.create_run_for_job(
            job_def, tags=batch_tags("q1"), status=DagsterRunStatus.NOT_STARTED
        )
        st = reader.status("q1")
        assert st is not None and st["status"] == "queued", st
        assert all(s["status"] == "pending" and s["error"] is None for s in st["steps"])

        LeaseStore(DurableDatabase.for_instance(reader.instance), ttl_s=3.0).acquire(
            "q1", "pending", "gone:1"
        )
        assert reader.status("q1")["status"] == "queued"  # type: ignore[index]  # its creator may live
        wait_until(lambda: not reader.lease_live("q1"), timeout=10, what="the creator's lease to lapse")
        st = reader.status("q1")
        assert st is not None and st["status"] == "failed", st
        assert st["progress"]["label"] == "Failed (worker lost): Loading invoices"
        assert "`job resume --id q1`" in st["steps"][0]["error"]
