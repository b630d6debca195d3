"""`job resume --id ID --wait` (issue #21 item 5): started right after a worker is frozen with
SIGSTOP, it waits for the lease to lapse and takes over, once, with no retry loop; after a SIGKILL
on this host it takes over at once (#25 item 5: the holder's process is known to be gone). Every
refund exactly once (counted in the embedded provider's file, which outlives the workers)."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest

from tests.crash.helpers import (
    EXIT_CONFLICT,
    EXIT_OK,
    EmbeddedProvider,
    Expected,
    JobProcess,
    assert_refunded_exactly_once,
    instance_reader,
    job,
    job_env,
)
from tests.support.homes import make_home
from tests.support.polling import wait_until

pytestmark = pytest.mark.slow

#: Long enough that the lease is still live when a new `job` process is up (~3 s on a loaded machine).
#: Long enough for a loaded machine to start `job resume` before a frozen worker's lease lapses.
LEASE_TTL_S = 15.0
SIZE = 300


def _running_step(st: dict[str, object] | None) -> int | None:
    running = [s["step"] for s in (st or {}).get("steps", []) if s["status"] == "in_progress"]  # type: ignore[attr-defined,index]
    return running[-1] if running else None


@pytest.mark.parametrize("how", ["sigkill", "sigstop"])
def test_resume_wait_takes_over_a_frozen_worker_once_its_lease_lapses_and_a_killed_one_at_once(
    how: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    # SIGSTOP on Postgres: a frozen SQLite writer could hold the file's lock (which `job resume`
    # refuses after 20 s, by design); both backends are covered between the two cases.
    pg = str(request.getfixturevalue("pg_database")) if how == "sigstop" else None
    home = make_home(tmp_path / "home", pg)
    batch = f"w-{how}"
    expected = Expected.of(batch, SIZE)
    env = job_env(home, lease_ttl_s=LEASE_TTL_S)
    slow = job_env(home, lease_ttl_s=LEASE_TTL_S, DURABLE_STEP_DELAY_S=1.0)
    worker = JobProcess(["run", "--id", batch, "--size", str(SIZE)], slow, tmp_path)
    with instance_reader(home) as reader:
        wait_until(
            lambda: (_running_step(reader.status(batch)) or 0) >= 4 or worker.proc.poll() is not None,
            timeout=180,
            what="step 4 (issuing refunds) to start",
        )
        assert worker.proc.poll() is None, worker.tail()
        if how == "sigkill":
            worker.sigkill()
        else:
            os.kill(worker.pid, signal.SIGSTOP)
        lease = reader.lease(batch)
        assert lease is not None and not lease.released and lease.expires_at > time.time()
    try:
        resumed = job(["resume", "--id", batch, "--wait"], env, tmp_path, timeout=240)
        assert resumed.proc.returncode == EXIT_OK, resumed.tail()
        waits = [line for line in resumed.stderr.splitlines() if line.startswith("resume: waiting up to")]
        if how == "sigstop":
            assert len(waits) == 1, resumed.tail()  # said once what it waits for, and how long
        else:  # the killed worker was a process of this host: its lease is not waited out
            assert waits == [], resumed.tail()
        assert_refunded_exactly_once(EmbeddedProvider(home).refunds(), expected)
    finally:
        worker.reap_group()  # a stopped process dies of SIGKILL as well


def test_resume_wait_past_its_deadline_is_still_a_conflict(tmp_path: Path) -> None:
    home = make_home(tmp_path / "home")
    slow = job_env(home, lease_ttl_s=30.0, DURABLE_STEP_DELAY_S=1.0)
    worker = JobProcess(["run", "--id", "w-live", "--size", "50"], slow, tmp_path)
    with instance_reader(home) as reader:
        wait_until(
            lambda: reader.lease_live("w-live") and reader.has_runs("w-live"), timeout=120, what="lease"
        )
    resumed = job(["resume", "--id", "w-live", "--wait", "1"], slow, tmp_path, timeout=60)
    assert resumed.proc.returncode == EXIT_CONFLICT, resumed.tail()
    assert "resume: waiting up to 1 s" in resumed.stderr and "still being run by" in resumed.stderr
    assert worker.wait(180) == EXIT_OK, worker.tail()  # the live worker was never disturbed
