"""The crash tier's tools: real `job` processes, SIGKILL, and side effects counted outside them.

Everything a crash test asserts on is read from somewhere the killed worker cannot lie about: the
payment simulator's own list API and counters (it runs in a thread of the *test* process, so it
outlives every worker), the embedded provider's SQLite file, the mailbox file, Dagster's run storage
and the lease table. Expected refunds are recomputed here from the batch id with the pure synthetic
generator and policy, independently of anything the worker stored.
"""

from __future__ import annotations

import itertools
import math
import os
import signal
import threading
import time
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd
import requests

from tests.support.batches import synthetic_candidates
from tests.support.homes import clean_env, open_instance, pg_url_of
from tests.support.machine import scaled, unscaled
from tests.support.network import Closing
from tests.support.polling import wait_until
from tests.support.processes import JOB, PYTHON, Process
from tests.support.simulator import ThreadedSimulator
from tests.support.tutorial import shop_count

EXIT_OK, EXIT_FAILED, EXIT_USAGE, EXIT_CONFLICT = 0, 1, 2, 3


def full_tier() -> bool:
    """The full tier (``--full``: tests/conftest.py sets the variable before test modules are
    collected; scripts/test.sh --full exports it): every crash point at every hit, every seeded
    random kill point. A function, read when a test module is imported: this module may be
    imported (by tests/crash/conftest.py) before the option is read."""
    return os.environ.get("DURABLE_CRASH_ENUMERATE", "").strip().lower() == "full"


def random_kill_points() -> int:
    """Seeded random kill points of a batch loop on SQLite (Postgres: half as many). The default
    tier kills at the first 10 of the seeded moments, the full tier at all 20: the same 10, then 10
    more. ``DURABLE_CRASH_POINTS`` overrides both."""
    return int(os.environ.get("DURABLE_CRASH_POINTS", "20" if full_tier() else "10"))


#: What the step a SIGKILL interrupted reads as right after it: still running while the lease is
#: live and the holder's death unknown, failed (worker lost) once it is known, at once on this host.
INTERRUPTED = ("in_progress", "failed")
API_KEY = "sk_test_crash_tier"


# --- instances and processes ---------------------------------------------------------------------


def job_env(
    home: Path, *, payments_url: str | None = None, lease_ttl_s: float = 2.0, **extra: object
) -> dict[str, str]:
    """A clean environment for a `job` process: our instance, our provider, nothing inherited."""
    settings: dict[str, object] = {"DURABLE_LEASE_TTL_S": lease_ttl_s}
    if payments_url:
        settings |= {"DURABLE_PAYMENTS_URL": payments_url, "STRIPE_API_KEY": API_KEY}
    return clean_env(home, **(settings | extra))


class JobProcess(Process):
    """One `job ...` process (own session, output in ``log_dir``), reaped after its test."""

    _seq = itertools.count(1)

    def __init__(
        self,
        args: list[str],
        env: Mapping[str, str],
        log_dir: Path,
        command: list[str] | None = None,
        cwd: Path | None = None,
    ) -> None:
        named = "-".join(args[:3]).replace("/", "_")  # an argument may be a path
        stem = log_dir / f"{next(JobProcess._seq):03d}-{named}"
        self.args = args
        argv = [*(command or [str(JOB)]), *args]
        super().__init__(
            argv,
            env,
            stem.with_suffix(".out"),
            stem.with_suffix(".err"),
            label=f"job {' '.join(args)}",
            cwd=cwd,
        )


def job(
    args: list[str],
    env: Mapping[str, str],
    log_dir: Path,
    timeout: float = 180,
    cwd: Path | None = None,
    command: list[str] | None = None,
) -> JobProcess:
    """Run `job ...` to completion (in ``cwd``, if given; ``command`` in place of ``job``)."""
    p = JobProcess(args, env, log_dir, command=command, cwd=cwd)
    p.wait(timeout)
    return p


_SIGKILL_IN_TEARDOWN = """\
import os, signal, sys

from durable_assets.kit.resources import BatchRuntime


def _sigkill_self(self, context):
    os.kill(os.getpid(), signal.SIGKILL)


BatchRuntime.teardown_after_execution = _sigkill_self
from durable_assets.ops.cli import main

sys.exit(main(sys.argv[1:]))
"""


def kill_mid_sending(
    folder: Path, env: Mapping[str, str], logs: Path, args: list[str], shop: Path, table_sql: str, size: int
) -> int:
    """Start `job` ``args`` in the tutorial's ``folder`` and SIGKILL it once the print ``shop`` holds
    10 cards (counted by ``table_sql`` in the shop's own file); returns the count at the kill."""
    worker = JobProcess(args, env, logs, cwd=folder)
    wait_until(
        lambda: shop_count(shop, table_sql) >= 10 or worker.proc.poll() is not None,
        timeout=120,
        what="the first cards",
    )
    assert worker.proc.poll() is None, f"the batch ended before the kill\n{worker.tail()}"
    worker.sigkill()
    worker.reap_group()
    at_kill = shop_count(shop, table_sql)
    assert 0 < at_kill < size, at_kill
    return at_kill


def job_killed_in_teardown(args: list[str], env: Mapping[str, str], log_dir: Path) -> JobProcess:
    """`job ...` (the same entry point, ``durable_assets.ops.cli:main``) in a process that SIGKILLs
    itself when the run's resources are torn down: after the last step's success is recorded and
    before Dagster records the run's. A random kill lands in that ~50 ms window only by luck.
    """
    launcher = log_dir / "sigkill_in_teardown.py"
    launcher.write_text(_SIGKILL_IN_TEARDOWN)
    return JobProcess(args, env, log_dir, command=[str(PYTHON), str(launcher)])


# --- the instance, read from the test process ----------------------------------------------------


class InstanceReader(Closing):
    """Read-only view of a Dagster instance shared with the workers (status, leases, runs).

    Opened the way the CLI opens it (under its first-open file lock), so creating the SQLite
    storages here never collides with a worker doing the same.
    """

    def __init__(self, home: Path) -> None:
        from durable_assets.kit.db import DurableDatabase
        from durable_assets.kit.leases import LeaseStore

        self.instance = open_instance(home)
        self._leases = LeaseStore(DurableDatabase.for_instance(self.instance))
        self.home = home

    def close(self) -> None:
        self.instance.dispose()

    def status(self, batch_id: str) -> dict[str, Any] | None:
        """``job status --json``'s object, or None while the batch has no run yet."""
        from durable_assets.errors import UnknownBatchError
        from durable_assets.ops.status import batch_status

        try:
            return batch_status(self.instance, batch_id).as_json()
        except UnknownBatchError:
            return None

    def has_runs(self, batch_id: str) -> bool:
        from durable_assets.ops.status import batch_runs

        return bool(batch_runs(self.instance, batch_id))

    def step_completed(self, batch_id: str, step: int) -> bool:
        st = self.status(batch_id)
        return bool(st) and st["steps"][step - 1]["status"] == "completed"  # type: ignore[index]

    def kill_after_step(self, worker: JobProcess, batch_id: str, step: int) -> dict[str, Any]:
        """SIGKILL ``worker`` once step ``step`` of its batch has committed; returns the batch's
        status at the kill, which shows steps 1..``step`` completed and the run not ended (a dead
        worker's run looks alive until its lease lapses, then reads failed: worker lost)."""
        worker.kill_when(
            lambda: self.step_completed(batch_id, step),
            timeout=120,
            interval=0.1,
            what=f"step {step} to complete",
        )
        at_kill = self.status(batch_id)
        assert at_kill is not None and at_kill["status"] in ("running", "failed"), at_kill
        assert [s["status"] for s in at_kill["steps"][:step]] == ["completed"] * step, at_kill
        return at_kill

    def assert_interrupted_in(self, batch_id: str, step: int) -> None:
        """The kill landed inside step ``step`` (1-based): it shows as running or failed (worker
        lost), never completed."""
        st = self.status(batch_id)
        assert st is not None and st["steps"][step - 1]["status"] in INTERRUPTED, st

    def lease(self, batch_id: str) -> Any:
        return self._leases.get(batch_id)

    def lease_live(self, batch_id: str) -> bool:
        lease = self._leases.get(batch_id)
        return lease is not None and lease.is_live()


#: ``with instance_reader(home) as reader:`` (closed on exit).
instance_reader = InstanceReader


def resume_until_accepted(
    batch_id: str,
    env: Mapping[str, str],
    log_dir: Path,
    reader: InstanceReader,
    *,
    size: int | None = None,
    timeout: float = 240,
    job_name: str | None = None,
    cwd: Path | None = None,
    command: list[str] | None = None,
) -> list[JobProcess]:
    """Continue a killed batch: `job resume` (or `job run` again if the kill came before the run
    existed; ``job_name`` is then its ``--job``), repeated while it answers 3 because the dead
    worker's lease is still live.

    Between attempts it waits for the lease to expire (read from the lease table) instead of
    hammering the CLI. Returns every attempt; the last one did not exit 3. ``timeout`` is for a quiet
    machine, scaled once here (what is left is handed to the helpers in quiet seconds again).
    """
    limit = scaled(timeout)
    deadline = time.monotonic() + limit
    attempts: list[JobProcess] = []
    while True:
        left = unscaled(deadline - time.monotonic())
        wait_until(lambda: not reader.lease_live(batch_id), timeout=max(left, 0.1), what="lease expiry")
        if reader.has_runs(batch_id) or size is None:
            args = ["resume", "--id", batch_id]
        else:
            args = ["run", *(["--job", job_name] if job_name else []), "--id", batch_id, "--size", str(size)]
        left = unscaled(deadline - time.monotonic())
        p = job(args, env, log_dir, timeout=max(left, 30), cwd=cwd, command=command)
        attempts.append(p)
        if p.proc.returncode != EXIT_CONFLICT:
            return attempts
        assert time.monotonic() < deadline, f"still conflicting after {limit:.0f} s\n{p.tail()}"


def kill_at_then_finish(
    worker: JobProcess,
    delay: float,
    batch_id: str,
    env: Mapping[str, str],
    log_dir: Path,
    reader: InstanceReader,
    *,
    size: int,
    job_name: str | None = None,
) -> tuple[str, JobProcess]:
    """SIGKILL ``worker`` ``delay`` s after its start (unless it finished first) and finish the batch
    the way a user would: `job resume`, or `job run` again if the kill came before the run existed.

    Returns where the kill landed ("finished", "no run yet", "after step N" or the batch's status)
    and the process that finished the batch. A batch that finished before the kill must answer a
    resume with "nothing to do".
    """
    if worker.exited_within(delay):
        assert worker.proc.returncode == EXIT_OK, worker.tail()
        again = job(["resume", "--id", batch_id], env, log_dir)
        assert again.proc.returncode == EXIT_OK and "nothing to do" in again.stdout, again.tail()
        return "finished", again
    worker.sigkill()
    st = reader.status(batch_id)
    if st is None:
        phase = "no run yet"
    else:
        done = sum(s["status"] == "completed" for s in st["steps"])
        alive_or_lost = st["status"] in ("running", "failed")  # the lease may have lapsed
        phase = f"after step {done}" if alive_or_lost else st["status"]
    attempts = resume_until_accepted(batch_id, env, log_dir, reader, size=size, job_name=job_name)
    return phase, attempts[-1]


def holds_no_write_lock(home: Path) -> bool:
    """True when no other process is inside a transaction on the instance's databases."""
    import sqlite3

    pg_url = pg_url_of(home)
    if pg_url:
        import psycopg2

        with psycopg2.connect(pg_url) as conn, conn.cursor() as cur:
            cur.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                "AND pid <> pg_backend_pid() AND state IS NOT NULL AND state <> 'idle'"
            )
            row = cur.fetchone()
        conn.close()
        if row and row[0]:
            return False
    for path in sorted(home.rglob("*.db")):
        conn = sqlite3.connect(str(path), timeout=0.05, isolation_level=None)
        try:
            conn.execute("BEGIN IMMEDIATE")
            conn.execute("ROLLBACK")
        except sqlite3.OperationalError:
            return False
        finally:
            conn.close()
    return True


def freeze_outside_transactions(pid: int, home: Path, progress: Callable[[], object]) -> None:
    """SIGSTOP ``pid`` at a moment it holds no database lock.

    A frozen (not dead) process keeps its locks: frozen inside a write transaction it would stall
    every other writer of the instance until it thaws (SQLite's file lock; a Postgres session's
    row locks), which is a stall, not an orphan scenario. When the freeze lands inside one, thaw,
    let ``progress`` change, and retry.
    """
    deadline = time.monotonic() + scaled(60)
    while True:
        os.kill(pid, signal.SIGSTOP)
        if holds_no_write_lock(home):
            return
        os.kill(pid, signal.SIGCONT)
        assert time.monotonic() < deadline, "could not freeze the worker outside a transaction"
        seen = progress()
        wait_until(
            lambda seen=seen: progress() != seen, timeout=30, interval=0.005, what="the worker to move on"
        )


# --- providers ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class RefundRequest:
    at: float
    api_key: str
    idempotency_key: str | None


class Simulator(ThreadedSimulator):
    """The Stripe-compatible simulator served from a thread of the test process, with the crash
    tier's read side: its list API and counters, and a log of who asked for which refund."""

    def __init__(self, db_path: Path, **faults: Any) -> None:
        super().__init__(db_path, poll_interval=0.05, **faults)
        #: The simulator's own SQLite store: read it (e.g. ``ProviderCredits.of_store``) after :meth:`quiet`.
        self.db = db_path
        self._http = requests.Session()

    def kill_inside(self, worker: JobProcess, counter: str, of: int, share: float = 0.3) -> dict[str, Any]:
        """SIGKILL ``worker`` once ``share`` of the ``of`` effects counted by ``counter`` reached this
        provider, then return its counters once the dead worker's in-flight requests have committed
        or failed: the kill must have landed inside the step (some sent, not all)."""
        k = math.ceil(share * of)
        worker.kill_when(lambda: self.stats()[counter] >= k, what=f"{k} of {of} {counter} at the provider")
        before = self.quiet()
        assert k <= before[counter] < of, (before, of)
        return before

    def record_refund_requests(self) -> list[RefundRequest]:
        """From now on, note every refund request as it arrives: when, from which API key, which key.

        Workers given different ``STRIPE_API_KEY`` values can then be told apart, which is how
        a test proves that a fenced-out orphan sent nothing.
        """
        from durable_assets_testing.simulator import SimulatorHandler

        log: list[RefundRequest] = []
        lock = threading.Lock()

        class Recording(SimulatorHandler):
            def _handle_api(self, path: str, encoded_params: str) -> None:
                if self.command == "POST" and path == "/v1/refunds":
                    auth = self.headers.get("Authorization", "")
                    entry = RefundRequest(
                        time.monotonic(), auth.removeprefix("Bearer "), self.headers.get("Idempotency-Key")
                    )
                    with lock:
                        log.append(entry)
                super()._handle_api(path, encoded_params)

        self.server.RequestHandlerClass = Recording
        return log

    def stats(self) -> dict[str, int]:
        """``GET /_sim/stats`` (never fault-injected)."""
        response = self._http.get(f"{self.url}/_sim/stats", timeout=10)
        response.raise_for_status()
        return {k: int(v) for k, v in response.json().items()}

    def quiet(self) -> dict[str, int]:
        """Stats once no request is in flight: a killed client's last requests still commit."""
        wait_until(lambda: self.server.in_flight_count() == 0, timeout=30, what="in-flight requests")
        return self.stats()

    def refunds(self) -> list[dict[str, Any]]:
        """Every refund, through the list API's cursor pagination (newest first)."""

        def page(starting_after: str | None) -> dict[str, Any]:
            params: dict[str, Any] = {"limit": 100}
            if starting_after:
                params["starting_after"] = starting_after
            response = self._http.get(
                f"{self.url}/v1/refunds",
                params=params,
                headers={"Authorization": f"Bearer {API_KEY}"},
                timeout=30,
            )
            response.raise_for_status()
            return dict(response.json())

        return all_pages(page)

    def close(self) -> None:
        self._http.close()
        super().close()


class EmbeddedProvider:
    """The embedded provider's file ($DAGSTER_HOME/payments.db), opened read-side by the test."""

    def __init__(self, home: Path) -> None:
        self.path = home / "payments.db"

    def stats(self) -> dict[str, int]:
        from durable_assets.payments.store import PaymentStore

        with PaymentStore(str(self.path)) as store:
            return store.stats()

    def refunds(self) -> list[dict[str, Any]]:
        from durable_assets.payments.store import PaymentStore

        with PaymentStore(str(self.path)) as store:
            return all_pages(lambda after: store.list_refunds(limit=100, starting_after=after))


def all_pages(page: Callable[[str | None], Mapping[str, Any]]) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    seen: set[str] = set()
    after: str | None = None
    while True:
        body = page(after)
        data = list(body["data"])
        for refund in data:
            assert refund["id"] not in seen, f"pagination returned {refund['id']} twice"
            seen.add(refund["id"])
        out += data
        if not body["has_more"] or not data:
            return out
        after = data[-1]["id"]


# --- what a batch must produce --------------------------------------------------------------------


@dataclass
class Expected:
    """A synthetic batch's refund candidates, recomputed from its id alone (pure functions)."""

    batch_id: str
    size: int
    candidates: pd.DataFrame = field(repr=False)

    @classmethod
    def of(cls, batch_id: str, size: int) -> Expected:
        return cls(batch_id, size, synthetic_candidates(batch_id, size))

    @property
    def n(self) -> int:
        return len(self.candidates)

    @property
    def invoice_prefix(self) -> str:
        from durable_assets.refunds.synthetic import batch_prefix

        return f"INV-{batch_prefix(self.batch_id)}-"

    def mine(self, refunds: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """This batch's refunds among all of a provider's (invoice ids embed the batch's hash)."""
        prefix = self.invoice_prefix
        return [r for r in refunds if str(r["metadata"].get("invoice_id", "")).startswith(prefix)]


def assert_refunded_exactly_once(refunds: list[dict[str, Any]], expected: Expected) -> None:
    """Each eligible invoice has exactly one refund at the provider, of the right amount and key."""
    from durable_assets.refunds.keys import refund_key

    mine = expected.mine(refunds)
    per_invoice = Counter(r["metadata"]["invoice_id"] for r in mine)
    twice = {inv: n for inv, n in per_invoice.items() if n > 1}
    assert not twice, f"{expected.batch_id}: invoices refunded more than once: {twice}"
    want = set(expected.candidates["invoice_id"])
    assert set(per_invoice) == want, (
        f"{expected.batch_id}: missing {sorted(want - set(per_invoice))[:5]}, "
        f"unexpected {sorted(set(per_invoice) - want)[:5]}"
    )
    rows = expected.candidates.set_index("invoice_id")
    for r in mine:
        row = rows.loc[r["metadata"]["invoice_id"]]
        assert int(r["amount"]) == int(row["refund_cents"]), (r, dict(row))
        assert r["metadata"]["idempotency_key"] == refund_key(str(row.name), str(row["reason"])), r
    keys = Counter(r["metadata"]["idempotency_key"] for r in mine)
    assert max(keys.values(), default=1) == 1, "one idempotency key produced two refunds"


def notices_for(home: Path, expected: Expected) -> int:
    """Customer notices delivered to this batch's recipients (the mailbox file, not the worker)."""
    from durable_assets.refunds.notices import Mailbox

    box = Mailbox(home / "mailbox.db")
    try:
        return sum(box.count(email) for email in set(expected.candidates["customer_email"]))
    finally:
        box.close()


def assert_batch_complete(status: Mapping[str, Any], home: Path, batch_id: str) -> None:
    """Succeeded, every step completed, and every step's stored output exists."""
    from durable_assets.refunds.job import refund_batch

    STEPS = refund_batch.step_keys

    assert status["status"] == "succeeded", status
    assert [s["status"] for s in status["steps"]] == ["completed"] * len(STEPS), status["steps"]
    assert_outputs_stored(status, home)


def stored_output(home: Path, ref: str) -> bytes | None:
    """The bytes of a step's ``output_ref``: a file of the home, or a ``durable://`` row of its database."""
    from durable_assets.kit.db import DurableDatabase
    from durable_assets.kit.storage import DATABASE_SCHEME, DatabaseStorage

    if not ref.startswith(DATABASE_SCHEME):
        path = Path(ref)
        return path.read_bytes() if path.is_file() else None
    db = DurableDatabase(pg_url_of(home) or f"sqlite:///{home / 'durable.db'}")
    return DatabaseStorage(db).get(ref[len(DATABASE_SCHEME) :])


def assert_outputs_stored(status: Mapping[str, Any], home: Path) -> None:
    """Every step's output is where the status says (the home's files, or its database on Postgres)."""
    for step in status["steps"]:
        ref = step["output_ref"]
        assert ref, f"step {step['step_name']} names no output: {step}"
        data = stored_output(home, ref)
        assert data, f"missing output {ref} of step {step['step_name']}"


def assert_ended_exactly_once(
    status: Mapping[str, Any], home: Path, refunds: list[dict[str, Any]], expected: Expected
) -> None:
    """What every refund crash test ends on: the batch succeeded with every step complete, each
    expected refund is at the provider exactly once, and each customer got exactly one notice."""
    assert_batch_complete(status, home, expected.batch_id)
    assert_refunded_exactly_once(refunds, expected)
    assert notices_for(home, expected) == expected.n
