"""Scenario 8 — refunds/s against a provider at 50 and at 100 req/s with no client-side setting.

Goal: >= 0.9 of the provider's limit with ``DURABLE_RATE_LIMIT`` unset: the shared limiter must
learn the limit from the provider's 429s. Measured in steady state, from when a quarter of the
refunds had settled to the last one: the provider's one-second burst at the start would otherwise
flatter the rate. Baseline, same run: the same refunds with the client capped at the provider's
limit (what a user had to configure before). Exactly-once and 429s from the provider's counters.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from bench.client import create_charges, intents, with_ledger
from bench.harness import Result, Size
from tests.support.simulator import SimulatorProcess

LIMITS = (50.0, 100.0)
LATENCY_MS = 100  # a real provider's answer time; 16 threads then offer up to 160 req/s
CONCURRENCY = 16  # DURABLE_CONCURRENCY's default
SECONDS = {"smoke": 3, "quick": 15, "full": 60}  # of sending, per limit


def _steady_rate(times: list[tuple[float, int]]) -> float:
    """Refunds/s from a quarter of the way to the end (progress reports: (time, done))."""
    total = times[-1][1]
    t_quarter, done_quarter = next((t, d) for t, d in times if d >= total // 4)
    return (total - done_quarter) / max(times[-1][0] - t_quarter, 1e-9)


def _measure(url: str, charges: list[str], tag: str, workdir: Path, rate: float | None) -> float:
    times: list[tuple[float, int]] = []
    with_ledger(
        url,
        intents(charges, tag),
        workdir,
        CONCURRENCY,
        rate,
        on_progress=lambda done, _of: times.append((time.monotonic(), done)),
    )
    return _steady_rate(sorted(times))


def run(size: Size, workdir: Path) -> Result:
    rows: dict[str, dict[str, Any]] = {}
    for limit in LIMITS:
        n = int(limit * SECONDS[size])
        db = workdir / f"pacing-{limit:.0f}.db"
        charges = create_charges(db, 2 * n)
        with SimulatorProcess(db, "--latency-ms", str(LATENCY_MS), "--rate-limit", str(int(limit))) as sim:
            before = sim.stats()
            learned = _measure(sim.url, charges[:n], f"a{limit:.0f}", workdir, None)
            after = sim.stats()
            time.sleep(1.5)  # let the provider's bucket refill before the baseline
            capped = _measure(sim.url, charges[n:], f"c{limit:.0f}", workdir, limit)
        created = after["refunds_created"] - before["refunds_created"]
        requests = after["refund_requests"] - before["refund_requests"]
        rows[f"{limit:.0f}"] = {
            "limit": limit,
            "refunds": n,
            "refunds_per_s": round(learned, 1),
            "ratio_to_limit": round(learned / limit, 3),
            "exactly_once": created == n,
            "refused_429_per_refund": round((requests - created) / n, 3),
            "baseline_capped_per_s": round(capped, 1),
        }
    ratios = [r["ratio_to_limit"] for r in rows.values()]
    once = all(r["exactly_once"] for r in rows.values())
    measured = "; ".join(
        f"at {k}: {r['refunds_per_s']}/s, {r['refused_429_per_refund']:.2f} 429s/refund"
        for k, r in rows.items()
    )
    return Result(
        8,
        "refunds, provider at 50 and at 100 req/s (100 ms), no client rate setting",
        measured=f"{measured}; {'exactly once' if once else 'NOT EXACTLY ONCE'}",
        baseline="; ".join(f"capped at {k}: {r['baseline_capped_per_s']}/s" for k, r in rows.items()),
        ratio=", ".join(f"{r:.3f}" for r in ratios) + " of the limit",
        goal=">= 0.9 of the limit, exactly once",
        met=min(ratios) >= 0.9 and once,
        data={"latency_ms": LATENCY_MS, "concurrency": CONCURRENCY, "limits": rows},
    )
