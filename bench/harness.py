"""What every scenario shares: sizes, result rows, statistics, and reading a shared instance.

Scenarios measure real processes (`job run`, `job provider serve`, `dagster-daemon`) from the
outside. Starting, waiting on and reaping them, temp instances and the simulator process are the
test suite's own helpers (``tests.support``, importable from the repository root, where
``python -m bench`` runs); what is here is about reading what the processes left behind (run
storage, our tables) and reporting it.
"""

from __future__ import annotations

import sqlite3
import statistics
import subprocess
import time
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from tests.support.batches import synthetic_candidates
from tests.support.homes import clean_env, open_instance
from tests.support.network import Closing
from tests.support.processes import JOB, PYTHON, REPO, Process

API_KEY = "sk_test_bench"

#: smoke: CI's harness check (seconds); quick: the default run (< 10 min in all); full: the issue's sizes.
Size = Literal["smoke", "quick", "full"]


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


def job_env(home: Path, **extra: object) -> dict[str, str]:
    """A clean environment for a `job` process: our tree, our instance, nothing inherited."""
    return clean_env(home, **({"PYTHONPATH": REPO} | extra))


def python_probe(code: str, arg: object, workdir: Path, timeout: float) -> subprocess.CompletedProcess[str]:
    """Run ``python -c code arg`` in a `job` process's environment, from the repository root: a
    measurement taken in a fresh interpreter (its own memory, its own imports), its output as text."""
    return subprocess.run(
        [str(PYTHON), "-c", code, str(arg)],
        capture_output=True,
        text=True,
        env=job_env(workdir),
        cwd=REPO,
        timeout=timeout,
        check=False,
    )


def job(args: Sequence[str], env: Mapping[str, str], logs: Path, timeout: float = 300) -> Process:
    """Run `job ...` to completion (start to exit is its ``wall_s``; stdout and stderr in one file)."""
    p = Process([str(JOB), *args], env, logs / f"{time.monotonic_ns()}-{'-'.join(args[:3])}.log")
    p.wait(timeout)
    return p


# --- reading an instance that workers share ------------------------------------------------------


class InstanceView(Closing):
    """Run storage and our tables of a temp instance, read from the bench process.

    Opened under the CLI's first-open lock (SQLite storages create tables on first open).
    """

    def __init__(self, home: Path) -> None:
        self.instance = open_instance(home)
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


#: ``with instance_view(home) as view:`` (closed on exit).
instance_view = InstanceView


def expected_refund_keys(batch_id: str, size: int) -> set[str]:
    """The idempotency keys a synthetic batch must refund, from the pure generator and policy alone."""
    from durable_assets.refunds.keys import refund_key

    candidates = synthetic_candidates(batch_id, size)
    return {
        refund_key(str(i), str(r))
        for i, r in zip(candidates["invoice_id"], candidates["reason"], strict=True)
    }
