"""What every scenario shares: sizes, result rows, statistics, processes, the simulator, instances.

Scenarios measure real processes (`job run`, `job provider serve`, `dagster-daemon`) from the
outside, so everything here is about starting them, waiting on conditions with a deadline, and
reading what they left behind (run storage, our tables, the simulator's counters).
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import signal
import socket
import sqlite3
import statistics
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, TypeVar

import httpx

REPO = Path(__file__).resolve().parents[1]
VENV_BIN = REPO / ".venv" / "bin"
PYTHON = VENV_BIN / "python" if (VENV_BIN / "python").exists() else Path(sys.executable)
JOB = VENV_BIN / "job"
API_KEY = "sk_test_bench"

#: smoke: CI's harness check (seconds); quick: the default run (< 10 min in all); full: the issue's sizes.
Size = Literal["smoke", "quick", "full"]
T = TypeVar("T")


@dataclass
class Result:
    """One scenario's row in the table, plus every raw number behind it for the JSON."""

    number: int
    title: str
    measured: str
    baseline: str = ""
    ratio: str = ""
    goal: str = ""
    met: bool | None = None
    data: dict[str, Any] = field(default_factory=dict)
    skipped: str | None = None

    def as_json(self) -> dict[str, Any]:
        return {
            "scenario": self.number,
            "title": self.title,
            "measured": self.measured,
            "baseline": self.baseline,
            "ratio": self.ratio,
            "goal": self.goal,
            "goal_met": self.met,
            "skipped": self.skipped,
            **self.data,
        }


def spread(values: Sequence[float], digits: int = 3) -> dict[str, Any]:
    """Median, min, max and the samples themselves (rounded), for the JSON."""
    return {
        "median": round(statistics.median(values), digits),
        "min": round(min(values), digits),
        "max": round(max(values), digits),
        "samples": [round(v, digits) for v in values],
    }


def wait_until(
    predicate: Callable[[], T | None], timeout: float, interval: float = 0.05, what: str = "the condition"
) -> T:
    """Poll ``predicate`` until it returns something truthy (returned) or ``timeout`` s pass (raise)."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() >= deadline:
            raise TimeoutError(f"timed out after {timeout:.1f} s waiting for {what}")
        time.sleep(interval)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


# --- processes -----------------------------------------------------------------------------------


class Proc:
    """A child process in its own session (so what it spawns can be reaped by its group id), with
    output in files so a chatty child never blocks on a pipe."""

    def __init__(self, argv: Sequence[str], env: Mapping[str, str], log: Path) -> None:
        self.argv = list(argv)
        self.log = log
        with open(log, "w") as out:
            self.proc = subprocess.Popen(
                self.argv, env=dict(env), stdout=out, stderr=subprocess.STDOUT, start_new_session=True
            )
        self.started = time.monotonic()
        self.ended: float | None = None

    @property
    def pid(self) -> int:
        return self.proc.pid

    def wait(self, timeout: float) -> int:
        try:
            rc = self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired as exc:
            self.reap()
            raise RuntimeError(
                f"{' '.join(self.argv[-4:])} did not finish in {timeout} s\n{self.tail()}"
            ) from exc
        self.ended = self.ended or time.monotonic()
        return rc

    @property
    def wall_s(self) -> float:
        if self.ended is None:
            raise RuntimeError("process still running")
        return self.ended - self.started

    def alive(self) -> bool:
        if self.proc.poll() is None:
            return True
        self.ended = self.ended or time.monotonic()
        return False

    def sigkill(self) -> float:
        """SIGKILL the process itself (no cleanup, no lease release); returns the kill's time."""
        t = time.monotonic()
        if self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGKILL)
        self.proc.wait(timeout=30)
        return t

    def stop(self, timeout: float = 20) -> None:
        """SIGTERM and wait (daemons shut their children down on it), then reap the group."""
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=30)
        self.reap()

    def reap(self) -> None:
        """Kill whatever is left of this child's process group (by its id, nothing else)."""
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=30)
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.proc.pid, signal.SIGKILL)

    def tail(self, chars: int = 2500) -> str:
        text = self.log.read_text(errors="replace")[-chars:]
        return f"--- {self.log.name} (rc={self.proc.returncode}):\n{text}"


def job_env(home: Path, **extra: object) -> dict[str, str]:
    """A clean environment for a `job` process: our tree, our instance, nothing inherited."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DURABLE_", "DAGSTER_", "STRIPE_"))}
    env["DAGSTER_HOME"] = str(home)
    env["PYTHONPATH"] = str(REPO)
    env["PYTHONUNBUFFERED"] = "1"
    env.update({name: str(value) for name, value in extra.items()})
    return env


def job(args: Sequence[str], env: Mapping[str, str], logs: Path, timeout: float = 300) -> Proc:
    """Run `job ...` to completion (start to exit is its ``wall_s``)."""
    p = Proc([str(JOB), *args], env, logs / f"{time.monotonic_ns()}-{'-'.join(args[:3])}.log")
    p.wait(timeout)
    return p


def make_home(root: Path, config: str = "telemetry:\n  enabled: false\n") -> Path:
    home = root / "dagster_home"
    home.mkdir(parents=True, exist_ok=True)
    (home / "dagster.yaml").write_text(config)
    return home


# --- the payment simulator -----------------------------------------------------------------------


class Simulator:
    """`job provider serve` in its own process, so the client under test has the CPU it would have."""

    def __init__(self, db: Path, *args: str) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self._proc = Proc(
            [str(JOB), "provider", "serve", "--port", str(self.port), "--db", str(db), *args],
            os.environ,
            db.with_suffix(".log"),
        )
        self._http = httpx.Client(timeout=10)

        def healthy() -> bool:
            if not self._proc.alive():
                raise RuntimeError(f"simulator exited\n{self._proc.tail()}")
            try:
                return self._http.get(f"{self.url}/healthz", timeout=1).status_code == 200
            except httpx.HTTPError:
                return False

        wait_until(healthy, timeout=60, what="the simulator to answer /healthz")

    def stats(self) -> dict[str, int]:
        return {k: int(v) for k, v in self._http.get(f"{self.url}/_sim/stats").json().items()}

    def stop(self) -> None:
        self._http.close()
        self._proc.stop(timeout=10)

    def __enter__(self) -> Simulator:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


# --- reading an instance that workers share ------------------------------------------------------


class InstanceView:
    """Run storage and our tables of a temp instance, read from the bench process.

    Opened under the CLI's first-open lock (SQLite storages create tables on first open).
    """

    def __init__(self, home: Path) -> None:
        from dagster import DagsterInstance

        with open(home / ".durable-open.lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            self.instance = DagsterInstance.from_config(str(home))
            _ = (self.instance.run_storage, self.instance.event_log_storage, self.instance.schedule_storage)
            from durable_assets.kit.db import DurableDatabase

            DurableDatabase.for_instance(self.instance)
        self.home = home
        self._durable = home / "durable.db"

    def close(self) -> None:
        self.instance.dispose()

    def query(self, sql: str, *params: object) -> list[tuple[Any, ...]]:
        """Our tables (SQLite instance), read-only."""
        con = sqlite3.connect(f"file:{self._durable}?mode=ro", uri=True, timeout=30)
        try:
            return con.execute(sql, params).fetchall()
        finally:
            con.close()

    def lease(self, batch_id: str) -> dict[str, Any] | None:
        rows = self.query(
            "SELECT run_id, owner, fence, expires_at, released FROM durable_leases WHERE batch_id = ?",
            batch_id,
        )
        if not rows:
            return None
        run_id, owner, fence, expires_at, released = rows[0]
        return {
            "run_id": run_id,
            "owner": owner,
            "fence": fence,
            "expires_at": expires_at,
            "released": released,
        }

    def lease_live(self, batch_id: str) -> bool:
        lease = self.lease(batch_id)
        return bool(lease) and not lease["released"] and lease["expires_at"] > time.time()  # type: ignore[index]

    def ledger_counts(self, scope: str, keys: set[str]) -> dict[str, int]:
        """Ledger rows per recovery point, among ``keys`` (the ledger is shared by all batches)."""
        rows = self.query("SELECT key, recovery_point FROM durable_idempotency WHERE scope = ?", scope)
        return dict(Counter(str(point) for key, point in rows if key in keys))

    def runs(self, batch_id: str) -> list[Any]:
        from durable_assets.ops.status import batch_runs

        return batch_runs(self.instance, batch_id)


@contextmanager
def instance_view(home: Path) -> Iterator[InstanceView]:
    view = InstanceView(home)
    try:
        yield view
    finally:
        view.close()


def expected_refund_keys(batch_id: str, size: int) -> set[str]:
    """The idempotency keys a synthetic batch must refund, from the pure generator and policy alone."""
    from durable_assets.refunds.keys import refund_key
    from durable_assets.refunds.policy import compute_refund_candidates
    from durable_assets.refunds.synthetic import synthetic_invoices
    from durable_assets.refunds.validation import validate_invoices

    valid = validate_invoices(synthetic_invoices(batch_id, size), require_charge_id=False).valid
    candidates = compute_refund_candidates(valid)
    return {
        refund_key(str(i), str(r))
        for i, r in zip(candidates["invoice_id"], candidates["reason"], strict=True)
    }
