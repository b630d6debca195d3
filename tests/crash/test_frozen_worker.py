"""A frozen worker on SQLite (#23 item 8): `job resume` takes over or says who blocks it, never hangs.

SIGSTOP keeps a process's SQLite write lock. Frozen outside a transaction, the worker holds
nothing and its batch is taken over once its lease lapses; frozen inside one, every writer of that
file would wait on it, so `job resume` must stop within a bound, naming the file and the pid
(exit 3), and finish the batch exactly once after the operator kills the frozen process.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from durable_assets.ops.sqlite_locks import LOCK_WAIT_S
from tests.support.homes import make_home
from tests.support.machine import scaled
from tests.support.polling import wait_until

from .helpers import (
    EXIT_CONFLICT,
    EXIT_OK,
    EmbeddedProvider,
    Expected,
    InstanceReader,
    JobProcess,
    Simulator,
    assert_refunded_exactly_once,
    instance_reader,
    job,
    job_env,
)

pytestmark = pytest.mark.slow


#: What "never hangs" means here: the bound, plus a slow machine's process start and instance open
#: (60 s on a quiet one, times this machine's slowness: tests/support/machine.py).
def deadline_s() -> float:
    return LOCK_WAIT_S + scaled(60)


_HOLD_AND_FREEZE = """\
import os, signal, sqlite3, sys
conn = sqlite3.connect(sys.argv[1], isolation_level=None)
conn.execute("BEGIN IMMEDIATE")
print("locked", flush=True)
os.kill(os.getpid(), signal.SIGSTOP)
"""


def _frozen(pid: int) -> bool:
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "T"


def _resume_past_frozen(
    worker: JobProcess, batch: str, env: dict[str, str], log_dir: Path, reader: InstanceReader
) -> None:
    """Once the frozen worker's lease lapsed: `job resume` takes over, or exits 3 within the bound
    naming the frozen pid; the operator then kills the worker and the next resume finishes."""
    try:
        wait_until(lambda: not reader.lease_live(batch), 30, what="the frozen worker's lease to lapse")
        started = time.monotonic()
        resumed = job(["resume", "--id", batch], env, log_dir, timeout=LOCK_WAIT_S + 240)
        took = time.monotonic() - started
        if resumed.proc.returncode == EXIT_CONFLICT:
            assert f"locked by process {worker.pid}" in resumed.stderr, resumed.tail()
            assert took < deadline_s(), took
    finally:
        worker.sigkill()  # the operator's way out; a no-op when the resume already took over
    if resumed.proc.returncode != EXIT_OK:
        resumed = job(["resume", "--id", batch], env, log_dir)
    assert resumed.proc.returncode == EXIT_OK, resumed.tail()


def test_a_process_frozen_holding_the_write_lock_is_named_within_the_bound(tmp_path: Path) -> None:
    home = make_home(tmp_path)
    env = job_env(home)
    first = job(["run", "--id", "locked", "--size", "50"], env, tmp_path)
    assert first.proc.returncode == EXIT_OK, first.tail()
    holder = subprocess.Popen(
        [sys.executable, "-c", _HOLD_AND_FREEZE, str(home / "durable.db")], stdout=subprocess.PIPE
    )
    try:
        wait_until(lambda: _frozen(holder.pid), 30, what="the lock holder to freeze")
        started = time.monotonic()
        blocked = job(["resume", "--id", "locked"], env, tmp_path, timeout=LOCK_WAIT_S + 60)
        took = time.monotonic() - started
    finally:
        holder.kill()
        holder.wait(scaled(10))
    assert blocked.proc.returncode == EXIT_CONFLICT, blocked.tail()
    line = blocked.stderr.strip()
    assert "\n" not in line, line
    assert f"durable.db has been locked by process {holder.pid}" in line, line
    assert f"kill -CONT {holder.pid}" in line, line
    assert took < deadline_s(), took
    after = job(["resume", "--id", "locked"], env, tmp_path)
    assert after.proc.returncode == EXIT_OK, after.tail()


@pytest.mark.parametrize("fraction", [0.2, 0.5, 0.8])
def test_a_worker_frozen_in_the_refund_step_is_taken_over_or_named(
    fraction: float, tmp_path: Path, simulator: Callable[..., Simulator]
) -> None:
    """Freeze the real worker (wherever its threads are, locks and all) at a point of step 4; each
    `job resume` either takes over once the lease lapses or exits 3 naming the frozen pid within the
    bound; after the operator kills it, every refund exists exactly once."""
    batch, size = f"frozen-{int(fraction * 100)}", 300
    expected = Expected.of(batch, size)
    sim = simulator(latency_ms=30)
    home = make_home(tmp_path)
    env = job_env(home, payments_url=sim.url, lease_ttl_s=2.0, DURABLE_CONCURRENCY=4)
    k = max(1, int(fraction * expected.n))
    with instance_reader(home) as reader:
        worker = JobProcess(["run", "--id", batch, "--size", str(size)], env, tmp_path)
        wait_until(
            lambda: sim.stats()["refunds_created"] >= k or not worker.alive(),
            120,
            interval=0.01,
            what=f"{k} refunds",
        )
        os.kill(worker.pid, signal.SIGSTOP)
        _resume_past_frozen(worker, batch, env, tmp_path, reader)
    sim.quiet()
    assert_refunded_exactly_once(sim.refunds(), expected)
    assert sim.stats()["refunds_created"] == expected.n


# --- frozen at every named crash point ------------------------------------------------------------

FULL = os.environ.get("DURABLE_CRASH_ENUMERATE", "").strip().lower() == "full"
#: Where a `job run` of the refund batch freezes (SIGSTOP, ``DURABLE_CRASH_AT=POINT:N:stop``), with a
#: pass that falls mid-batch. By default one point of each kind of boundary (the ledger's phases, a
#: step's commit, the run's end); ``DURABLE_CRASH_ENUMERATE=full`` adds every other point a run passes.
FREEZE_POINTS = [
    ("after_intent_commit", 2),
    ("after_provider_answer", 30),
    ("step_body_done", 4),
    ("all_steps_done", 1),
]
FREEZE_POINTS_FULL = [
    ("before_provider_request", 30),
    ("after_result_commit", 1),
    ("after_lease_renewal", 2),
    ("after_progress_write", 5),
    ("after_cancel_check", 3),
    ("step_start", 4),
    ("run_end", 1),
]


@pytest.mark.parametrize(
    ("point", "hit"), FREEZE_POINTS + (FREEZE_POINTS_FULL if FULL else []), ids=lambda v: str(v)
)
def test_a_worker_frozen_at_a_named_point_never_hangs_the_resume(
    point: str, hit: int, tmp_path: Path
) -> None:
    """The worker stops itself (SIGSTOP, every thread and lock kept) at an exact boundary. `job
    resume` takes over once the lease lapses, or exits 3 within the bound naming the frozen pid;
    after the operator kills the frozen worker, the batch finishes with every refund exactly once
    (embedded provider: its SQLite file is one more lock a frozen worker could hold)."""
    batch, size = f"frozen-{point}", 120
    expected = Expected.of(batch, size)
    home = make_home(tmp_path)
    env = job_env(home, DURABLE_CONCURRENCY=4)
    worker = JobProcess(
        ["run", "--id", batch, "--size", str(size)],
        {**env, "DURABLE_CRASH_AT": f"{point}:{hit}:stop"},
        tmp_path,
    )
    wait_until(
        lambda: _frozen(worker.pid) or not worker.alive(), 120, what=f"the worker to freeze at {point}"
    )
    assert worker.alive(), f"the run ended before passing {point}:{hit}\n{worker.tail()}"
    with instance_reader(home) as reader:
        _resume_past_frozen(worker, batch, env, tmp_path, reader)
    assert_refunded_exactly_once(EmbeddedProvider(home).refunds(), expected)
