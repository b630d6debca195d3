"""The distributed tier's cluster: a Postgres instance, a broker queue and real `job worker`s per test.

Each test gets its own Postgres database (Dagster's storage and our tables, as the committed
``dagster_home/distributed/dagster.yaml`` configures it), its own RabbitMQ queue (so a worker of
one test never takes another's task), a simulator served from a thread of the test process (its
store outlives every worker and is what side effects are counted from), and workers started as
real `job worker` processes in their own sessions, killed by process group at teardown.
"""

from __future__ import annotations

import contextlib
import os
import signal
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from tests.crash.helpers import InstanceReader, JobProcess, Simulator, job_env
from tests.support import network
from tests.support.homes import shipped_home
from tests.support.machine import scaled
from tests.support.polling import wait_until
from tests.support.processes import kill_group

BROKER_URL = os.environ.get("DURABLE_TEST_BROKER_URL", network.DEFAULT_BROKER_URL)
#: Short leases so a lost worker or orchestrator is noticed in seconds, not the production 15 s.
LEASE_TTL_S = 3.0
STEP_LEASE_TTL_S = 3.0


def broker_available() -> bool:
    return network.broker_available(BROKER_URL)


def wait_until_ready(worker: JobProcess) -> JobProcess:
    """Until a `job worker` consumes its queue (Celery's "ready." line); one that exits fails here."""
    wait_until(
        lambda: "ready." in worker.stderr or worker.proc.poll() is not None,
        timeout=90,
        interval=0.1,
        what="the worker to be ready",
    )
    assert worker.proc.poll() is None, f"the worker exited\n{worker.tail()}"
    return worker


@dataclass
class Cluster:
    """One test's distributed deployment: instance, queue, provider, workers."""

    home: Path
    logs: Path
    pg_url: str
    queue: str
    sim: Simulator
    workers: list[JobProcess] = field(default_factory=list)
    extra_env: dict[str, Any] = field(default_factory=dict)

    def env(self, **extra: Any) -> dict[str, str]:
        return job_env(
            self.home,
            payments_url=self.sim.url,
            lease_ttl_s=LEASE_TTL_S,
            DAGSTER_PG_URL=self.pg_url,
            DURABLE_BROKER_URL=BROKER_URL,
            DURABLE_BROKER_QUEUE=self.queue,
            DURABLE_STEP_LEASE_TTL_S=STEP_LEASE_TTL_S,
            **{**self.extra_env, **extra},
        )

    def worker(self, concurrency: int = 2, **extra: Any) -> JobProcess:
        """A `job worker`, once it consumes the queue."""
        p = JobProcess(["worker", "--concurrency", str(concurrency)], self.env(**extra), self.logs)
        self.workers.append(p)
        return wait_until_ready(p)

    def live_workers(self) -> list[JobProcess]:
        return [w for w in self.workers if w.proc.poll() is None]

    def kill_worker(self, worker: JobProcess) -> None:
        """SIGKILL a worker with its pool children (its whole process group), and reap it."""
        kill_group(worker.pid, signal.SIGKILL)
        worker.proc.wait(timeout=scaled(30))

    def run(self, job_name: str, batch_id: str, size: int, shards: int = 4, **extra: Any) -> JobProcess:
        args = ["run", "--job", job_name, "--id", batch_id, "--size", str(size)]
        return JobProcess(
            [*args, "--executor", "celery", "--shards", str(shards)], self.env(**extra), self.logs
        )

    def job(self, args: list[str], timeout: float = 240, **extra: Any) -> JobProcess:
        p = JobProcess(args, self.env(**extra), self.logs)
        p.wait(timeout)
        return p

    def close(self) -> None:
        for w in self.workers:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                kill_group(w.pid, signal.SIGKILL)
            with contextlib.suppress(Exception):
                w.proc.wait(timeout=scaled(10))
        delete_queue(self.queue)


def delete_queue(queue: str) -> None:
    """Best effort: a per-test queue left in RabbitMQ is only clutter."""
    with contextlib.suppress(Exception):
        from kombu import Connection

        with Connection(BROKER_URL, connect_timeout=3) as conn:
            conn.default_channel.queue_delete(queue)


@pytest.fixture
def cluster(tmp_path: Path, pg_database: str) -> Iterator[Cluster]:
    if not broker_available():
        if os.environ.get("CI"):
            pytest.fail(
                f"RabbitMQ is not reachable at {BROKER_URL}; scripts/setup.sh --with-rabbitmq starts it"
            )
        pytest.skip("RabbitMQ not reachable")
    home = shipped_home(tmp_path, "distributed")
    logs = tmp_path / "logs"
    logs.mkdir()
    sim = Simulator(tmp_path / "simulator.db", latency_ms=30, api_keys=["sk_test_crash_tier"])
    c = Cluster(home, logs, pg_database, f"durable_test_{uuid.uuid4().hex[:10]}", sim)
    try:
        yield c
    finally:
        c.close()
        sim.close()


@pytest.fixture
def reader(cluster: Cluster) -> Iterator[InstanceReader]:
    os.environ["DAGSTER_PG_URL"] = cluster.pg_url  # the test process reads the same instance
    r = InstanceReader(cluster.home)
    try:
        yield r
    finally:
        r.close()
        os.environ.pop("DAGSTER_PG_URL", None)
