"""Scenario 10's per-task overhead alone, for two source trees side by side (issue #24 item 5).

The full scenario takes minutes and four workers; this measures only the figure a change to the
worker's task path moves: the same small batch in process and distributed (one `job worker`,
``--concurrency 1``, a 0 ms provider), ``(distributed - in process) / tasks``, plus each task's own
time inside the worker (Celery's prerun to postrun, recorded by a ``sitecustomize`` this script
puts on the worker's path). Trees alternate sample by sample, so the machine's load (shared, noisy)
falls on both alike; read the ratios.

    PYTHONPATH=. .venv/bin/python -m bench.task_overhead --tree before=/tmp/base --tree after=. \\
        --samples 3 [--profile DIR]

``--tree LABEL=PATH,no-compute-logs`` runs that tree with Dagster's ``NoOpComputeLogManager``.
``--profile DIR`` also writes a cProfile of every task (``DIR/<tree>/<pid>-<n>.prof``).
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import shutil
import statistics
import subprocess
import tempfile
import time
import uuid
from contextlib import ExitStack
from pathlib import Path
from typing import Any

from bench.harness import API_KEY, job_env
from tests.support.homes import postgres_database
from tests.support.network import DEFAULT_BROKER_URL
from tests.support.polling import wait_until
from tests.support.processes import JOB, Process
from tests.support.simulator import SimulatorProcess

#: Put first on a worker's PYTHONPATH: times (and, asked, profiles) each task in the pool child.
_SITECUSTOMIZE = """
import os
_out = os.environ.get("TASK_TIMES_FILE")
if _out:
    import json, time
    from celery.signals import task_postrun, task_prerun
    import sqlalchemy
    from sqlalchemy.engine import Engine
    _profile_dir = os.environ.get("TASK_PROFILE_DIR")
    _started = {}
    _count = [0]
    _statements = [0]

    @sqlalchemy.event.listens_for(Engine, "before_cursor_execute")
    def _counted(*_a, **_kw):
        _statements[0] += 1

    @task_prerun.connect(weak=False)
    def _pre(task_id=None, **_kw):
        prof = None
        if _profile_dir:
            import cProfile
            prof = cProfile.Profile()
            prof.enable()
        _started[task_id] = (time.perf_counter(), time.process_time(), _statements[0], prof)

    @task_postrun.connect(weak=False)
    def _post(task_id=None, kwargs=None, **_kw):
        t0, cpu0, sql0, prof = _started.pop(task_id, (None, None, None, None))
        if t0 is None:
            return
        elapsed, cpu, sql = time.perf_counter() - t0, time.process_time() - cpu0, _statements[0] - sql0
        if prof is not None:
            prof.disable()
            _count[0] += 1
            prof.dump_stats(os.path.join(_profile_dir, f"{os.getpid()}-{_count[0]}.prof"))
        with open(_out, "a") as f:
            record = {"pid": os.getpid(), "s": elapsed, "cpu_s": cpu, "sql": sql, "end": time.time()}
            f.write(json.dumps(record) + "\\n")
"""


_NO_COMPUTE_LOGS = """
compute_logs:
  module: dagster.core.storage.noop_compute_log_manager
  class: NoOpComputeLogManager
"""


class _Tree:
    def __init__(
        self,
        label: str,
        path: Path,
        work: Path,
        pg_url: str,
        sim_url: str,
        profile: Path | None,
        no_compute_logs: bool,
    ) -> None:
        self.label, self.path = label, path.resolve()
        self.work = work / label
        self.work.mkdir(parents=True)
        self.custom = self.work / "custom"
        self.custom.mkdir()
        (self.custom / "sitecustomize.py").write_text(_SITECUSTOMIZE)
        self.times = self.work / "task_times.jsonl"
        # The tree's own instance config: a change may be in its dagster.yaml as well as its code.
        self.home = self.work / "dagster_home"
        self.home.mkdir()
        shutil.copy(self.path / "dagster_home" / "distributed" / "dagster.yaml", self.home / "dagster.yaml")
        if no_compute_logs:  # Dagster's documented switch: no per-step stdout/stderr capture
            with open(self.home / "dagster.yaml", "a") as f:
                f.write(_NO_COMPUTE_LOGS)
        self.queue = f"overhead_{label}_{uuid.uuid4().hex[:6]}"
        self.pg_url, self.sim_url = pg_url, sim_url
        self.profile = profile / label if profile else None
        if self.profile:
            self.profile.mkdir(parents=True)
        self.worker: Process | None = None

    def env(self, worker: bool = False) -> dict[str, str]:
        extra: dict[str, Any] = {}
        if worker:
            extra["TASK_TIMES_FILE"] = self.times
            if self.profile:
                extra["TASK_PROFILE_DIR"] = self.profile
        env = job_env(
            self.home,
            DAGSTER_PG_URL=self.pg_url,
            DURABLE_PAYMENTS_URL=self.sim_url,
            STRIPE_API_KEY=API_KEY,
            DURABLE_BROKER_URL=DEFAULT_BROKER_URL,
            DURABLE_BROKER_QUEUE=self.queue,
            DURABLE_CONCURRENCY=4,
            **extra,
        )
        env["PYTHONPATH"] = f"{self.custom}:{self.path}" if worker else str(self.path)
        return env

    def start_worker(self) -> None:
        log = self.work / "worker.log"
        self.worker = Process(
            [str(JOB), "worker", "--concurrency", "1"], self.env(worker=True), log, cwd=self.path
        )
        w = self.worker
        wait_until(lambda: "ready." in w.stdout or not w.alive(), timeout=180, what=f"{self.label}'s worker")
        if not w.alive():
            raise RuntimeError(w.tail())

    def run(self, args: list[str]) -> float:
        log = self.work / f"run-{uuid.uuid4().hex[:6]}.log"
        p = Process([str(JOB), "run", *args], self.env(), log, cwd=self.path)
        rc = p.wait(600)
        if rc not in (0, 4):
            raise RuntimeError(f"{self.label}: job run {args} exited {rc}\n{p.tail()}")
        return p.wall_s

    def task_records(self) -> list[dict[str, float]]:
        if not self.times.exists():
            return []
        return [json.loads(line) for line in self.times.read_text().splitlines() if line.strip()]


def _tasks_of(pg_url: str, batch_id: str) -> int:
    import sqlalchemy as sa

    from durable_assets.kit.db import DurableDatabase, step_leases

    with DurableDatabase(pg_url).engine.connect() as conn:
        query = sa.select(sa.func.count()).select_from(step_leases).where(step_leases.c.batch_id == batch_id)
        return int(conn.execute(query).scalar_one())


def _mean_gap(records: list[dict[str, float]]) -> float:
    """Mean idle time of the (one) worker between consecutive tasks of a batch."""
    spans = sorted((r["end"] - r["s"], r["end"]) for r in records)
    gaps = [max(0.0, start - prev_end) for (_, prev_end), (start, _) in itertools.pairwise(spans)]
    return statistics.mean(gaps) if gaps else float("nan")


def _load() -> str:
    return subprocess.run(["uptime"], capture_output=True, text=True, check=False).stdout.strip()


_SUMMARY = {
    "overhead_ms": "overhead/task ms",
    "task_mean_ms": "task wall ms",
    "task_cpu_ms": "task CPU ms",
    "task_sql": "SQL/task",
    "gap_ms": "idle between tasks ms",
}


def _summary(samples: list[dict[str, float]], key: str) -> str:
    values = [s[key] for s in samples]
    return f"{_SUMMARY[key]} {statistics.median(values):.0f} ({min(values):.0f}..{max(values):.0f})"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tree", action="append", required=True, help="LABEL=PATH[,no-compute-logs]")
    parser.add_argument("--samples", type=int, default=3)
    parser.add_argument("--size", type=int, default=200, help="invoices per batch")
    parser.add_argument("--shards", type=int, default=4)
    parser.add_argument("--profile", type=Path, default=None)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    results: dict[str, list[dict[str, float]]] = {}
    print("load at start:", _load(), flush=True)
    with ExitStack() as stack:
        work = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="task-overhead-")))
        pg_url = stack.enter_context(postgres_database(prefix="durable_bench"))
        os.environ["DAGSTER_PG_URL"] = pg_url
        sim = stack.enter_context(SimulatorProcess(work / "sim.db", "--api-key", API_KEY))
        trees = []
        for spec in args.tree:
            label, rest = spec.split("=", 1)
            path, _, option = rest.partition(",")
            tree = _Tree(label, Path(path), work, pg_url, sim.url, args.profile, option == "no-compute-logs")
            tree.start_worker()
            stack.callback(lambda t=tree: t.worker and t.worker.reap_group())
            trees.append(tree)
            results[label] = []
        for i in range(args.samples):
            for tree in trees if i % 2 == 0 else reversed(trees):
                seen = len(tree.task_records())
                local_id, dist_id = f"loc-{tree.label}-{i}", f"dist-{tree.label}-{i}"
                local_s = tree.run(["--id", local_id, "--size", str(args.size)])
                dist_s = tree.run(
                    [
                        "--id",
                        dist_id,
                        "--size",
                        str(args.size),
                        "--executor",
                        "celery",
                        "--shards",
                        str(args.shards),
                    ]
                )
                tasks = _tasks_of(pg_url, dist_id)
                records = tree.task_records()[seen:]
                n = max(len(records), 1)
                sample = {
                    "local_s": local_s,
                    "dist_s": dist_s,
                    "tasks": tasks,
                    "overhead_ms": 1000 * (dist_s - local_s) / tasks,
                    "task_mean_ms": 1000 * sum(r["s"] for r in records) / n,
                    "task_cpu_ms": 1000 * sum(r["cpu_s"] for r in records) / n,
                    "task_sql": sum(r["sql"] for r in records) / n,
                    "outside_tasks_s": dist_s - sum(r["s"] for r in records),
                    # the worker idle between one task's end and the next one's start: the
                    # orchestrator noticing the result, sending the next step, the broker delivering it
                    "gap_ms": 1000 * _mean_gap(records),
                }
                results[tree.label].append(sample)
                print(
                    f"{tree.label:>8} #{i}: in process {local_s:5.1f} s, distributed {dist_s:5.1f} s, "
                    f"{tasks} tasks: {sample['overhead_ms']:4.0f} ms/task overhead; a task in the worker "
                    f"{sample['task_mean_ms']:4.0f} ms wall, {sample['task_cpu_ms']:4.0f} ms CPU, "
                    f"{sample['task_sql']:4.0f} SQL statements; "
                    f"outside tasks {sample['outside_tasks_s']:.1f} s, idle between tasks "
                    f"{sample['gap_ms']:.0f} ms mean [{time.strftime('%X')}]",
                    flush=True,
                )
        print("load at end:", _load())
    for label, samples in results.items():
        print(f"{label:>8}: " + "; ".join(_summary(samples, key) for key in _SUMMARY))
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
