"""Benchmarks: refund throughput at a provider's rate limit, and what the ledger costs.

    .venv/bin/python bench/run.py            # quick size
    .venv/bin/python bench/run.py --full     # issue sizes (20,000 refunds at the limit)

Every figure is measured in this run, next to a baseline measured in the same run, because these
machines are shared and noisy. Prints a table and writes bench/results/latest.json.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from durable_assets.kit.db import DurableDatabase  # noqa: E402
from durable_assets.kit.effects import EffectRunner, RateLimiter  # noqa: E402
from durable_assets.kit.ledger import Intent, Ledger  # noqa: E402
from durable_assets.payments.gateway import StripeGateway  # noqa: E402


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Simulator:
    """`job provider serve` in its own process, so the client under test has the CPU it would have."""

    def __init__(self, db: Path, *args: str) -> None:
        self.port = _free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        exe = REPO / ".venv" / "bin" / "job"
        self.proc = subprocess.Popen(
            [str(exe), "provider", "serve", "--port", str(self.port), "--db", str(db), *args],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                if httpx.get(f"{self.url}/healthz", timeout=1).status_code == 200:
                    return
            except httpx.HTTPError:
                time.sleep(0.05)
        raise RuntimeError("simulator did not start")

    def stats(self) -> dict[str, int]:
        return dict(httpx.get(f"{self.url}/_sim/stats", timeout=5).json())

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(timeout=10)


def _charges(db: Path, n: int) -> list[str]:
    sim = Simulator(db)
    try:
        gw = StripeGateway(sim.url, "sk_test_bench")
        with ThreadPoolExecutor(32) as pool:
            charges = list(
                pool.map(
                    lambda i: gw.create_charge(
                        amount=5000, currency="usd", customer=f"c{i}", metadata={}, idempotency_key=f"ch-{i}"
                    ).id,
                    range(n),
                )
            )
    finally:
        sim.stop()
    return charges


def _intents(charges: list[str], tag: str) -> list[Intent]:
    return [
        Intent(f"{tag}-{i}", {"charge_id": c, "amount": 100, "currency": "usd", "invoice_id": f"{tag}-{i}"})
        for i, c in enumerate(charges)
    ]


def _perform(gw: StripeGateway) -> Callable[[Intent], dict[str, Any]]:
    def call(i: Intent) -> dict[str, Any]:
        p = i.params
        r = gw.create_refund(
            charge_id=p["charge_id"],
            amount=p["amount"],
            currency=p["currency"],
            reason="overcharge",
            metadata={"invoice_id": p["invoice_id"]},
            idempotency_key=i.key,
        )
        return {"id": r.id, "amount": r.amount}

    return call


def _with_ledger(url: str, intents: list[Intent], workdir: Path, concurrency: int, rate: float | None) -> float:
    ledger = Ledger(DurableDatabase(f"sqlite:///{workdir / f'ledger-{time.monotonic_ns()}.db'}"))
    runner = EffectRunner(
        ledger=ledger,
        scope="refund",
        owner="bench",
        perform=_perform(StripeGateway(url, "sk_test_bench")),
        concurrency=concurrency,
        limiter=RateLimiter(rate, burst=max(1.0, (rate or 0) / 20)),
    )
    t0 = time.perf_counter()
    report = runner.run(intents)
    elapsed = time.perf_counter() - t0
    assert len(report.results) == len(intents), "not every refund finished"
    return len(intents) / elapsed


def _without_ledger(url: str, intents: list[Intent], concurrency: int) -> float:
    call = _perform(StripeGateway(url, "sk_test_bench"))
    t0 = time.perf_counter()
    with ThreadPoolExecutor(concurrency) as pool:
        list(pool.map(call, intents))
    return len(intents) / (time.perf_counter() - t0)


def scenario_throughput(workdir: Path, n: int, baseline_n: int) -> dict[str, Any]:
    db = workdir / "throughput.db"
    charges = _charges(db, n + baseline_n)
    sim = Simulator(db, "--latency-ms", "100", "--rate-limit", "100")
    try:
        sequential = _without_ledger(sim.url, _intents(charges[n:], "seq"), concurrency=1)
        time.sleep(1.5)  # let the provider's rate-limit bucket refill between the two measurements
        before = sim.stats()
        rate = _with_ledger(sim.url, _intents(charges[:n], "thr"), workdir, concurrency=32, rate=100.0)
        after = sim.stats()
    finally:
        sim.stop()
    created = after["refunds_created"] - before["refunds_created"]
    return {
        "scenario": "1. refunds at a 100 req/s, 100 ms provider",
        "refunds": n,
        "refunds_per_s": round(rate, 1),
        "ratio_to_limit": round(rate / 100.0, 3),
        "baseline_sequential_per_s": round(sequential, 1),
        "speedup_vs_sequential": round(rate / sequential, 1),
        "exactly_once": created == n,
        "requests_per_refund": round((after["refund_requests"] - before["refund_requests"]) / n, 3),
    }


def scenario_ledger_overhead(workdir: Path, n: int, repeats: int = 3) -> dict[str, Any]:
    db = workdir / "overhead.db"
    charges = _charges(db, n * repeats * 2)
    sim = Simulator(db)
    try:
        with_l, without = [], []
        for r in range(repeats):
            base = charges[2 * r * n : (2 * r + 1) * n]
            led = charges[(2 * r + 1) * n : (2 * r + 2) * n]
            without.append(_without_ledger(sim.url, _intents(base, f"nl{r}"), concurrency=16))
            with_l.append(_with_ledger(sim.url, _intents(led, f"l{r}"), workdir, concurrency=16, rate=None))
    finally:
        sim.stop()
    med = lambda xs: sorted(xs)[len(xs) // 2]  # noqa: E731
    return {
        "scenario": "2. ledger overhead (0 ms provider, no limit)",
        "refunds": n,
        "with_ledger_per_s": round(med(with_l), 1),
        "without_ledger_per_s": round(med(without), 1),
        "ledger_cost": round(1 - med(with_l) / med(without), 3),
        "min_max_with": [round(min(with_l), 1), round(max(with_l), 1)],
        "min_max_without": [round(min(without), 1), round(max(without), 1)],
        "ledger_commits_per_refund": round(2 / 200, 3),  # one claim + one result commit per 200-key chunk
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--full", action="store_true", help="issue sizes instead of the quick ones")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        results = [
            scenario_throughput(work, 20_000 if args.full else 2_000, 100),
            scenario_ledger_overhead(work, 2_000 if args.full else 1_000),
        ]
    info = {"machine": platform.platform(), "cpus": os.cpu_count(), "python": platform.python_version()}
    out = REPO / "bench" / "results"
    out.mkdir(parents=True, exist_ok=True)
    (out / "latest.json").write_text(json.dumps({"info": info, "results": results}, indent=2))
    for r in results:
        print(f"\n{r['scenario']}")
        for k, v in r.items():
            if k != "scenario":
                print(f"  {k:<28} {v}")
    print(f"\nwritten: {out / 'latest.json'}")


if __name__ == "__main__":
    main()
