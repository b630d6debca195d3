"""One clock, the database's: a process whose own clock is 40 s off changes nothing.

Real processes run under Debian's ``faketime`` (libfaketime shifts every clock the process reads)
against the test's Postgres, as a worker on a host with a wrong clock would. Each one ahead and one
behind: neither steals a live run lease, neither makes a lease it wrote last longer or shorter than
its TTL, neither sees a lapsed lease as live; step leases likewise; and the account-wide rate
bucket, drawn on by both at once, hands out no more than its rate.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from durable_assets.errors import LeaseHeldError
from durable_assets.kit.db import DurableDatabase, rate_limits
from durable_assets.kit.leases import LeaseStore
from durable_assets.kit.step_leases import StepLeaseStore
from tests.support.hosts import faketime_command
from tests.support.machine import scaled
from tests.support.polling import wait_until
from tests.support.processes import REPO

pytestmark = pytest.mark.postgres

SKEWS = ("+40s", "-40s")
#: Another host's worker: never "gone" to this host's /proc check, so only the clock decides.
ELSEWHERE = "other-host:1:x"
TTL_S = 5.0


def _faketime() -> str:
    """The ``faketime`` command, or skip: without it no process of ours can have another clock."""
    found = faketime_command()
    if found is None:
        pytest.skip("faketime (libfaketime) is not installed: apt-get install faketime (scripts/setup.sh)")
    probe = subprocess.run(
        [found, "-f", "+40s", sys.executable, "-c", "import time; print(time.time())"],
        capture_output=True,
        text=True,
        timeout=scaled(60),
        check=False,
    )
    if probe.returncode != 0 or not 30 < float(probe.stdout.strip() or 0) - time.time() < 50:
        pytest.skip(f"faketime does not shift this Python's clock here: {probe.stderr.strip()[:200]}")
    return found


def _env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(REPO)}


def _skewed(skew: str, code: str, *args: str) -> subprocess.CompletedProcess[str]:
    """Run ``code`` (with ``sys.argv[1:] == args``) in a Python whose clock is off by ``skew``."""
    done = subprocess.run(
        [_faketime(), "-f", skew, sys.executable, "-c", code, *args],
        capture_output=True,
        text=True,
        env=_env(),
        timeout=scaled(120),
        check=False,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    return done


TAKE_LEASE = """
import sys
from durable_assets.errors import LeaseHeldError
from durable_assets.kit.db import DurableDatabase
from durable_assets.kit.leases import LeaseStore

url, run_id, ttl = sys.argv[1], sys.argv[2], float(sys.argv[3])
try:
    LeaseStore(DurableDatabase(url), ttl_s=ttl).acquire("b", run_id, owner="skewed-host:2:y")
    print("taken")
except LeaseHeldError:
    print("held")
"""


@pytest.mark.parametrize("skew", SKEWS)
def test_a_lease_written_on_a_wrong_clock_lasts_its_ttl(pg_database: str, skew: str) -> None:
    """Ahead, its lease would outlive it by 40 s; behind, it would be lapsed the moment it was taken."""
    store = LeaseStore(DurableDatabase(pg_database), ttl_s=60)
    assert _skewed(skew, TAKE_LEASE, pg_database, "skewed-run", str(TTL_S)).stdout.strip() == "taken"
    taken_at = time.monotonic()
    lease = store.get("b")
    assert lease is not None and lease.is_live()
    assert 0 < lease.seconds_left() <= TTL_S
    with pytest.raises(LeaseHeldError):
        store.acquire("b", "our-run", owner=ELSEWHERE)
    # The skewed process is gone without renewing: its lease lapses after its TTL, not 40 s later.
    wait_until(lambda: not store.get("b").is_live(), timeout=TTL_S + 5, what="the skewed lease to lapse")  # type: ignore[union-attr]
    assert store.acquire("b", "our-run", owner=ELSEWHERE).fence == lease.fence + 1
    assert time.monotonic() - taken_at < TTL_S + scaled(5)


@pytest.mark.parametrize("skew", SKEWS)
def test_a_wrong_clock_neither_steals_a_live_lease_nor_waits_on_a_lapsed_one(
    pg_database: str, skew: str
) -> None:
    store = LeaseStore(DurableDatabase(pg_database), ttl_s=TTL_S)
    held = store.acquire("b", "our-run", owner=ELSEWHERE)
    assert _skewed(skew, TAKE_LEASE, pg_database, "skewed-run", "60").stdout.strip() == "held"
    kept = store.get("b")
    assert kept is not None and (kept.run_id, kept.fence, kept.expires_at) == (
        "our-run",
        held.fence,
        held.expires_at,
    )
    wait_until(lambda: not store.get("b").is_live(), timeout=TTL_S + 5, what="our lease to lapse")  # type: ignore[union-attr]
    assert _skewed(skew, TAKE_LEASE, pg_database, "skewed-run", "60").stdout.strip() == "taken"
    taken = store.get("b")
    assert taken is not None and taken.run_id == "skewed-run" and taken.fence == held.fence + 1


TAKE_STEP = """
import sys
from durable_assets.kit.db import DurableDatabase
from durable_assets.kit.step_leases import StepLeaseStore

url, ttl = sys.argv[1], float(sys.argv[2])
store = StepLeaseStore(DurableDatabase(url), ttl_s=ttl)
owner = "skewed-host:2:task"
print(store.acquire("r1", "step", "b", 1, owner) and store.renew("r1", "step", owner))
"""


@pytest.mark.parametrize("skew", SKEWS)
def test_a_step_lease_renewed_on_a_wrong_clock_lapses_on_time(pg_database: str, skew: str) -> None:
    """The orchestrator re-sends a step whose lease lapsed: not 40 s late, and not at once."""
    store = StepLeaseStore(DurableDatabase(pg_database), ttl_s=TTL_S)
    assert _skewed(skew, TAKE_STEP, pg_database, str(TTL_S)).stdout.strip() == "True"
    row = store.of_run("r1")["step"]
    assert not row.lapsed and 0 < row.expires_at - row.read_at <= TTL_S
    wait_until(lambda: store.of_run("r1")["step"].lapsed, timeout=TTL_S + 5, what="the step lease to lapse")


#: Low enough that a loaded machine can always spend it: the test is about the clocks, not speed.
RATE = 40.0
DURATION_S = 4.0
SPEND = """
import sys, time
from durable_assets.kit.db import DurableDatabase
from durable_assets.kit.pacing import SharedBucket, SharedRateLimiter

url, rate, duration = sys.argv[1], float(sys.argv[2]), float(sys.argv[3])
limiter = SharedRateLimiter(SharedBucket(DurableDatabase(url), "acct_skew", rate))
print("ready", flush=True)
sys.stdin.readline()
end_at = time.monotonic() + duration
sent = 0
while True:
    limiter.acquire()
    if time.monotonic() >= end_at:
        break
    sent += 1
print(sent, flush=True)
"""


def test_processes_on_wrong_clocks_share_the_account_rate_and_do_not_exceed_it(pg_database: str) -> None:
    db = DurableDatabase(pg_database)  # tables made once, before the processes race to open them
    command = _faketime()
    procs = [
        subprocess.Popen(
            [command, "-f", skew, sys.executable, "-c", SPEND, pg_database, str(RATE), str(DURATION_S)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            env=_env(),
        )
        for skew in SKEWS
    ]
    try:
        for p in procs:  # the window starts when both can draw
            assert p.stdout is not None and p.stdout.readline().strip() == "ready"
        for p in procs:
            assert p.stdin is not None
            p.stdin.write("go\n")
            p.stdin.flush()
        counts = [int(p.communicate(timeout=scaled(60))[0].strip()) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    total = sum(counts)
    burst = max(1.0, RATE * 0.05)
    assert total <= RATE * DURATION_S + burst + len(procs), (counts, total)
    assert total >= 0.9 * RATE * DURATION_S, (counts, total)
    assert all(c > 0 for c in counts), counts  # neither clock starves the other
    with db.read() as conn:
        stamped = conn.execute(rate_limits.select()).one().updated_at
        assert abs(db.clock(conn) - stamped) < 5  # the bucket keeps the database's time, not 40 s off


def test_the_database_clock_is_the_servers_not_ours(pg_database: str) -> None:
    """What the tests above rest on: a skewed process reads the same database time we do."""
    code = (
        "import sys, time\nfrom durable_assets.kit.db import DurableDatabase\n"
        "db = DurableDatabase(sys.argv[1])\n"
        "with db.read() as conn:\n    print(db.clock(conn) - time.time())\n"
    )
    ahead = float(_skewed("+40s", code, pg_database).stdout.strip())
    db = DurableDatabase(pg_database)
    with db.read() as conn:
        ours = db.clock(conn) - time.time()
    assert abs(ours) < 5 and abs(ahead + 40 - ours) < 5, (ours, ahead)
