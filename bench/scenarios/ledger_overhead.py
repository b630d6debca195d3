"""Scenario 2 — what the ledger costs: refunds/s with it vs the same client without it.

Provider at zero latency and no limit, so the bookkeeping is all there is to see. Goal: <= 10%
(it was 20% with one commit per 200-key chunk; the group commit records every 50 ms instead and
must not cost more). Runs alternate (without, with, ...) so drift on a shared machine hits both
sides alike. Also measured: what an unarmed named crash point costs per pass (every durable
boundary passes one; it must cost next to nothing when no test armed it).
"""

from __future__ import annotations

import time
from pathlib import Path

from bench.client import create_charges, intents, with_ledger, without_ledger
from bench.harness import Result, Size, spread
from durable_assets.kit import crashpoints
from durable_assets.kit.crashpoints import CrashPoint, crash_point
from tests.support.simulator import SimulatorProcess

SIZES = {"smoke": (200, 1), "quick": (1_000, 3), "full": (2_000, 5)}  # refunds per sample, samples


def run(size: Size, workdir: Path) -> Result:
    n, repeats = SIZES[size]
    db = workdir / "overhead.db"
    charges = create_charges(db, n * repeats * 2)
    with_l, without, commits = [], [], []
    with SimulatorProcess(db) as sim:
        for r in range(repeats):
            base = charges[2 * r * n : (2 * r + 1) * n]
            led = charges[(2 * r + 1) * n : (2 * r + 2) * n]
            without.append(without_ledger(sim.url, intents(base, f"nl{r}"), concurrency=16).per_s)
            timed = with_ledger(sim.url, intents(led, f"l{r}"), workdir, concurrency=16, rate=None)
            with_l.append(timed.per_s)
            commits.append(timed.ledger_commits / n)
    w, wo = spread(with_l, 1), spread(without, 1)
    cost = 1 - w["median"] / wo["median"]
    crash_ns = unarmed_crash_point_ns()
    return Result(
        2,
        f"ledger overhead, {n:,} refunds, 0 ms provider",
        measured=f"{w['median']:.0f} refunds/s with the ledger ({w['min']:.0f}..{w['max']:.0f}), "
        f"{statistics_median(commits):.3f} ledger commits/refund; unarmed crash point {crash_ns:.0f} ns/pass",
        baseline=f"{wo['median']:.0f}/s without ({wo['min']:.0f}..{wo['max']:.0f})",
        ratio=f"{w['median'] / wo['median']:.3f} (cost {cost:+.1%})",
        goal="cost <= 10%",
        met=cost <= 0.10,
        data={
            "refunds": n,
            "repeats": repeats,
            "with_ledger_per_s": w,
            "without_ledger_per_s": wo,
            "ledger_cost": round(cost, 3),
            "ledger_commits_per_refund": spread(commits, 4),
            "unarmed_crash_point_ns": round(crash_ns, 1),
        },
    )


def unarmed_crash_point_ns(passes: int = 1_000_000) -> float:
    """Nanoseconds per :func:`crash_point` call in an unarmed process (best of 5, loop included)."""
    crashpoints.disarm()
    best = float("inf")
    for _ in range(5):
        t0 = time.perf_counter_ns()
        for _ in range(passes):
            crash_point(CrashPoint.AFTER_RESULT_COMMIT)
        best = min(best, (time.perf_counter_ns() - t0) / passes)
    return best


def statistics_median(values: list[float]) -> float:
    return float(spread(values, 4)["median"])
