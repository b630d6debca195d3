"""Scenario 1 — refunds/s against a provider with 100 ms latency and a 100 req/s limit.

Goal: >= 0.95 of the limit. Baseline, same run, same provider: the same refunds sent one at a
time (what a naive loop achieves). Exactly-once is checked on the provider's own counters.
"""

from __future__ import annotations

import time
from pathlib import Path

from bench.client import create_charges, intents, with_ledger, without_ledger
from bench.harness import Result, Size, spread
from tests.support.simulator import SimulatorProcess

LIMIT = 100.0
SIZES = {
    "smoke": (200, 10, 1),
    "quick": (2_000, 50, 3),
    "full": (20_000, 100, 3),
}  # refunds, sequential, repeats


def run(size: Size, workdir: Path) -> Result:
    n, n_seq, repeats = SIZES[size]
    db = workdir / "throughput.db"
    charges = create_charges(db, repeats * (n + n_seq))
    rates, seq, per_refund_requests, commits = [], [], [], []
    created_ok = True
    with SimulatorProcess(db, "--latency-ms", "100", "--rate-limit", str(int(LIMIT))) as sim:
        for r in range(repeats):
            base = r * (n + n_seq)
            seq.append(
                without_ledger(sim.url, intents(charges[base + n : base + n + n_seq], f"s{r}"), 1).per_s
            )
            time.sleep(1.5)  # let the provider's rate-limit bucket refill between measurements
            before = sim.stats()
            timed = with_ledger(sim.url, intents(charges[base : base + n], f"t{r}"), workdir, 32, LIMIT)
            after = sim.stats()
            rates.append(timed.per_s)
            commits.append(timed.ledger_commits / n)
            created_ok &= after["refunds_created"] - before["refunds_created"] == n
            per_refund_requests.append((after["refund_requests"] - before["refund_requests"]) / n)
            time.sleep(1.5)
    rate, sequential = spread(rates, 1), spread(seq, 1)
    ratio = rate["median"] / LIMIT
    return Result(
        1,
        f"{n:,} refunds, provider at 100 ms and {LIMIT:.0f} req/s",
        measured=f"{rate['median']:.1f} refunds/s ({rate['min']:.1f}..{rate['max']:.1f}), "
        f"{'exactly once' if created_ok else 'NOT EXACTLY ONCE'}, {max(per_refund_requests):.2f} req/refund",
        baseline=f"sequential {sequential['median']:.1f}/s",
        ratio=f"{ratio:.3f} of the limit; {rate['median'] / sequential['median']:.1f}x sequential",
        goal=">= 0.95 of the limit",
        met=ratio >= 0.95 and created_ok,
        data={
            "refunds": n,
            "repeats": repeats,
            "refunds_per_s": rate,
            "ratio_to_limit": round(ratio, 3),
            "baseline_sequential_per_s": sequential,
            "speedup_vs_sequential": round(rate["median"] / sequential["median"], 1),
            "exactly_once": created_ok,
            "requests_per_refund": spread(per_refund_requests),
            "ledger_commits_per_refund": spread(commits, 4),
        },
    )
