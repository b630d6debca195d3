"""Refunds sent straight from the bench process: through the ledger (EffectRunner) or without it.

Scenarios 1 and 2 measure the exactly-once engine itself, not the pipeline around it, so they
drive :class:`EffectRunner` directly against a simulator in another process.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import sqlalchemy as sa

from bench.harness import API_KEY
from durable_assets.kit.db import DurableDatabase
from durable_assets.kit.effects import EffectRunner, RateLimiter
from durable_assets.kit.ledger import Intent, Ledger
from durable_assets.payments.gateway import StripeGateway
from tests.support.simulator import SimulatorProcess


def create_charges(db: Path, n: int) -> list[str]:
    """``n`` charges on a simulator file (served just for this), to refund against later."""
    with SimulatorProcess(db) as sim:
        gw = StripeGateway(sim.url, API_KEY)
        with ThreadPoolExecutor(32) as pool:
            return list(
                pool.map(
                    lambda i: (
                        gw.create_charge(
                            amount=5000,
                            currency="usd",
                            customer=f"c{i}",
                            metadata={},
                            idempotency_key=f"ch-{i}",
                        ).id
                    ),
                    range(n),
                )
            )


def intents(charges: list[str], tag: str) -> list[Intent]:
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


@dataclass
class Timed:
    per_s: float
    seconds: float
    ledger_commits: int = 0


def with_ledger(
    url: str,
    batch: list[Intent],
    workdir: Path,
    concurrency: int,
    rate: float | None,
    on_progress: Callable[[int, int], None] = lambda _done, _of: None,
) -> Timed:
    """The production path: intents commit before requests, results by group commit (50 ms or 200 keys).

    ``rate`` None: no client setting, the limiter learns the provider's limit from its 429s."""
    db = DurableDatabase(f"sqlite:///{workdir / f'ledger-{time.monotonic_ns()}.db'}")
    commits = 0

    def count(_conn: Any) -> None:
        nonlocal commits
        commits += 1

    sa.event.listen(db.engine, "commit", count)
    runner = EffectRunner(
        ledger=Ledger(db),
        scope="refund",
        owner="bench",
        perform=_perform(StripeGateway(url, API_KEY)),
        concurrency=concurrency,
        limiter=RateLimiter(rate),
        on_progress=on_progress,
    )
    t0 = time.perf_counter()
    report = runner.run(batch)
    elapsed = time.perf_counter() - t0
    if len(report.results) != len(batch):
        raise RuntimeError(f"only {len(report.results)} of {len(batch)} refunds finished")
    return Timed(len(batch) / elapsed, elapsed, commits)


def without_ledger(url: str, batch: list[Intent], concurrency: int) -> Timed:
    """The same client and thread pool, no ledger: what exactly-once bookkeeping is compared to."""
    call = _perform(StripeGateway(url, API_KEY))
    t0 = time.perf_counter()
    with ThreadPoolExecutor(concurrency) as pool:
        list(pool.map(call, batch))
    elapsed = time.perf_counter() - t0
    return Timed(len(batch) / elapsed, elapsed)
