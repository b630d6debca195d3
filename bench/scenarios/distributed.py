"""Scenario 10 — distributed refunds: throughput vs 1, 2, 4 `job worker`s, a binding limit, task overhead.

Setup: Postgres instance (``dagster_home/distributed``), RabbitMQ, the simulator at 100 ms. Each
worker runs one task at a time (``--concurrency 1``) with ``DURABLE_CONCURRENCY=4`` requests in
flight, so one worker alone is bound at ~40 req/s by latency and more workers add throughput until
the shards (4) are all running. Measured: refunds/s of the sharded ``issued_refunds`` step (first
shard start to last shard end, from the event log; refunds counted at the provider).

- non-binding limit: 1, 2, 4 workers (issue #37's goal: 4 workers at least 3.5x one; each shard
  pays ~0.4 s of its own start and end, and the step waits for its largest shard);
- binding limit: ``DURABLE_RATE_LIMIT`` below what 4 workers could send; the account's one bucket
  must keep them at >= 0.95 of it and never above;
- per-task overhead: the same small batch in process and distributed on one worker, 0 ms provider:
  (distributed - in process) / tasks (issue #37's goal: at most 100 ms).
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

from bench.harness import API_KEY, Result, Size, job, job_env, spread
from tests.support.homes import postgres_available, postgres_database, shipped_home
from tests.support.network import DEFAULT_BROKER_URL, broker_available
from tests.support.polling import wait_until
from tests.support.processes import JOB, Process
from tests.support.simulator import SimulatorProcess

BROKER = DEFAULT_BROKER_URL
SHARDS = 4
PER_TASK_CONCURRENCY = 4
GOAL_SPEEDUP = 3.5  # issue #37 item 5: 4 workers against one
GOAL_TASK_S = 0.100  # issue #37 item 5: overhead per task
SIZES = {  # invoices per throughput batch, binding limit (req/s), invoices for the overhead pair
    "smoke": (300, 15.0, 50),
    "quick": (1_500, 30.0, 200),
    "full": (6_000, 60.0, 1_000),
}


class _Deployment:
    def __init__(self, workdir: Path, stack: ExitStack, pg_url: str, sim_url: str) -> None:
        self.home = shipped_home(workdir / f"home-{uuid.uuid4().hex[:6]}", "distributed")
        self.logs = workdir / "logs"
        self.logs.mkdir(exist_ok=True)
        self.queue = f"bench_{uuid.uuid4().hex[:8]}"
        self.pg_url, self.sim_url, self.stack = pg_url, sim_url, stack
        self.workers: list[Process] = []

    def env(self, **extra: object) -> dict[str, str]:
        return job_env(
            self.home,
            DAGSTER_PG_URL=self.pg_url,
            DURABLE_PAYMENTS_URL=self.sim_url,
            STRIPE_API_KEY=API_KEY,
            DURABLE_BROKER_URL=BROKER,
            DURABLE_BROKER_QUEUE=self.queue,
            DURABLE_CONCURRENCY=PER_TASK_CONCURRENCY,
            **extra,
        )

    def start_workers(self, n: int, **extra: object) -> None:
        for _ in range(n):
            p = Process(
                [str(JOB), "worker", "--concurrency", "1"],
                self.env(**extra),
                self.logs / f"worker-{uuid.uuid4().hex[:6]}.log",
            )
            self.workers.append(p)
            self.stack.callback(p.reap_group)
        for p in self.workers:
            wait_until(lambda p=p: "ready." in p.stdout or not p.alive(), timeout=120, what="a worker")

    def stop_workers(self) -> None:
        for p in self.workers:
            p.reap_group()
        self.workers = []


def _shard_span(home: Path, pg_url: str, batch_id: str, step: str) -> tuple[float, list[int], dict[str, Any]]:
    """Seconds from the first shard of ``step`` starting to the last one succeeding, each shard's
    rows (the step waits for its largest), and when each shard started and ended (seconds after
    the first start, in shard order: what a worker's task start cost, what its work)."""
    import os

    from dagster import DagsterEventType, DagsterInstance

    from durable_assets.ops.status import batch_runs

    os.environ["DAGSTER_PG_URL"] = pg_url
    kinds = {
        DagsterEventType.STEP_START,
        DagsterEventType.STEP_SUCCESS,
        DagsterEventType.ASSET_MATERIALIZATION,
    }
    with DagsterInstance.from_config(str(home)) as instance:
        run = batch_runs(instance, batch_id)[-1]
        starts: dict[str, float] = {}
        ends: dict[str, float] = {}
        rows: dict[str, int] = {}
        for record in instance.all_logs(run.run_id, of_type=kinds):
            event = record.dagster_event
            if event is None or not str(event.step_key).startswith(f"{step}__shard_"):
                continue
            if event.event_type == DagsterEventType.ASSET_MATERIALIZATION:
                metadata = event.step_materialization_data.materialization.metadata
                rows[str(event.step_key)] = int(metadata["rows"].value)  # type: ignore[arg-type]
                continue
            (starts if event.event_type == DagsterEventType.STEP_START else ends)[str(event.step_key)] = (
                record.timestamp
            )
    first = min(starts.values())
    timeline = {
        "starts_s": [round(starts[k] - first, 3) for k in sorted(starts)],
        "ends_s": [round(ends[k] - first, 3) for k in sorted(ends)],
    }
    return max(ends.values()) - first, [rows[k] for k in sorted(rows)], timeline


def _refund_rate(
    dep: _Deployment, sim: SimulatorProcess, n: int, tag: str, **extra: object
) -> dict[str, Any]:
    """One batch; its refund requests sampled at the provider every 50 ms while it runs."""
    batch = f"dist-bench-{tag}-{uuid.uuid4().hex[:6]}"
    before = sim.stats()
    args = ["run", "--id", batch, "--size", str(n), "--executor", "celery", "--shards", str(SHARDS)]
    p = Process([str(JOB), *args], dep.env(**extra), dep.logs / f"run-{batch}.log")
    samples: list[tuple[float, int]] = []
    while p.alive():
        samples.append((time.monotonic(), sim.stats()["refund_requests"]))
        time.sleep(0.05)  # the sampling period of a measurement, not a wait for a condition
    if p.proc.returncode not in (0, 4):
        raise RuntimeError(f"batch {batch} failed\n{p.tail()}")
    after = sim.stats()
    refunds = after["refunds_created"] - before["refunds_created"]
    requests = after["refund_requests"] - before["refund_requests"]
    span, shard_rows, shard_times = _shard_span(dep.home, dep.pg_url, batch, "issued_refunds")
    return {
        "refunds": refunds,
        "requests": requests,
        "span_s": round(span, 3),
        "shard_rows": shard_rows,
        "shard_times": shard_times,
        "per_s": refunds / span,  # the step's own rate, shard task starts included
        "provider_per_s": _flowing_rate(samples, before["refund_requests"], after["refund_requests"]),
        "wall_s": round(p.wall_s, 2),
    }


def _flowing_rate(samples: list[tuple[float, int]], first: int, last: int) -> float:
    """Requests/s from the first sample past ``first`` to the first at ``last``: while they flowed."""
    started = next(((t, c) for t, c in samples if c > first), None)
    ended = next(((t, c) for t, c in samples if c >= last), samples[-1] if samples else None)
    if started is None or ended is None or ended[0] <= started[0]:
        return 0.0
    return (ended[1] - started[1]) / (ended[0] - started[0])


@contextmanager
def _deployment(workdir: Path, *sim_args: str) -> Iterator[tuple[_Deployment, SimulatorProcess]]:
    with ExitStack() as stack:
        pg_url = stack.enter_context(postgres_database(prefix="durable_bench"))
        sim = stack.enter_context(
            SimulatorProcess(workdir / f"sim-{uuid.uuid4().hex[:6]}.db", *sim_args, "--api-key", API_KEY)
        )
        yield _Deployment(workdir, stack, pg_url, sim.url), sim


def run(size: Size, workdir: Path) -> Result:
    n, limit, n_overhead = SIZES[size]
    if not (postgres_available() and broker_available(BROKER)):
        return Result(10, "distributed refunds", measured="", skipped="needs Postgres and RabbitMQ")
    by_workers: dict[int, dict[str, Any]] = {}
    with _deployment(workdir, "--latency-ms", "100") as (dep, sim):
        for workers in (1, 2, 4):
            dep.start_workers(workers)
            by_workers[workers] = _refund_rate(dep, sim, n, f"w{workers}")
            dep.stop_workers()
        # The limit is the workers' setting (they send the requests), the same value on every one.
        dep.start_workers(4, DURABLE_RATE_LIMIT=limit)
        binding = _refund_rate(dep, sim, n, "limit", DURABLE_RATE_LIMIT=limit)
        dep.stop_workers()
    with _deployment(workdir) as (dep, sim):
        local = job(["run", "--id", "overhead-local", "--size", str(n_overhead)], dep.env(), dep.logs)
        local_s = local.wall_s
        dep.start_workers(1)
        dist = job(
            [
                "run",
                "--id",
                "overhead-dist",
                "--size",
                str(n_overhead),
                "--executor",
                "celery",
                "--shards",
                "4",
            ],
            dep.env(),
            dep.logs,
        )
        dist_s = dist.wall_s
        tasks = _tasks(dep)
        dep.stop_workers()
    overhead_per_task = (dist_s - local_s) / tasks
    one, four = by_workers[1]["per_s"], by_workers[4]["per_s"]
    # Against the account's limit: the rate the provider saw while requests flowed.
    binding_rate = binding["provider_per_s"]
    exactly_once = all(r["refunds"] == r["requests"] for r in [*by_workers.values(), binding])
    met = (
        four >= GOAL_SPEEDUP * one
        and overhead_per_task <= GOAL_TASK_S
        and 0.95 * limit <= binding_rate <= limit * 1.01
        and exactly_once
    )
    return Result(
        10,
        f"distributed refunds ({n:,} invoices, {SHARDS} shards, provider at 100 ms)",
        measured=", ".join(
            f"{w} worker{'s' if w > 1 else ''} {r['per_s']:.1f}/s" for w, r in by_workers.items()
        )
        + f" (step span; shards of {'/'.join(map(str, by_workers[4]['shard_rows']))} rows)"
        + f"; limit {limit:.0f}/s binding, 4 workers: {binding_rate:.1f}/s at the provider; "
        f"{overhead_per_task * 1000:.0f} ms overhead per task",
        baseline=f"in process, 0 ms provider, {n_overhead} invoices: {local_s:.1f} s; "
        f"distributed {dist_s:.1f} s",
        ratio=f"4 workers {four / one:.2f}x one; {binding_rate / limit:.3f} of the limit",
        goal=f"4 workers >= {GOAL_SPEEDUP}x one; <= {GOAL_TASK_S * 1000:.0f} ms a task; "
        ">= 0.95 of a binding limit, never above; exactly once",
        met=met,
        data={
            "invoices": n,
            "shards": SHARDS,
            "per_task_concurrency": PER_TASK_CONCURRENCY,
            "by_workers": by_workers,
            "binding_limit": limit,
            "binding": binding,
            "binding_ratio": round(binding_rate / limit, 3),
            "speedup_4_vs_1": round(four / one, 2),
            "overhead": {
                "invoices": n_overhead,
                "in_process_s": round(local_s, 2),
                "distributed_s": round(dist_s, 2),
                "tasks": tasks,
                "per_task_s": round(overhead_per_task, 3),
            },
            "exactly_once": exactly_once,
            "refunds_per_s_by_workers": spread([r["per_s"] for r in by_workers.values()]),
        },
    )


def _tasks(dep: _Deployment) -> int:
    """Tasks the distributed overhead batch ran (its step lease rows: one per step, shard and check)."""
    import sqlalchemy as sa

    from durable_assets.kit.db import DurableDatabase, step_leases

    with DurableDatabase(dep.pg_url).engine.connect() as conn:
        return int(conn.execute(sa.select(sa.func.count()).select_from(step_leases)).scalar_one())
