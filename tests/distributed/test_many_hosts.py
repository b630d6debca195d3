"""Many hosts for real: every process on a "host" of its own, sharing only Postgres and RabbitMQ.

The orchestrator, each worker and the resuming CLI start in mount namespaces of their own with a
private tmpfs over the folder that holds the instance folders (``tests/support/hosts.py``): step
outputs, the batch's files and its input must travel through the shared database, because no
process can open another's files, even by an absolute path passed along with a task. One worker
runs 40 s ahead under ``faketime``: leases and the rate bucket take the database's time, so its
clock changes nothing. A running shard's worker, then the orchestrator, are SIGKILLed; `job resume`
runs from a third folder; the provider's own store must show every effect exactly once, and the
progress the test read while it ran never went back.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.crash.helpers import (
    EXIT_OK,
    JOB,
    Expected,
    InstanceReader,
    JobProcess,
    assert_refunded_exactly_once,
    resume_until_accepted,
)
from tests.support.credits import CREDIT_STEPS, ProviderCredits, assert_credits_exact, expected_balances
from tests.support.hosts import Hosts, faketime_command, private_mounts_available
from tests.support.machine import scaled
from tests.support.polling import wait_until
from tests.support.processes import kill_group

from .conftest import STEP_LEASE_TTL_S, Cluster
from .test_distributed import status_of
from .test_worker_loss import newest_run_id, running_shard_worker, step_leases

pytestmark = [pytest.mark.slow, pytest.mark.postgres]

AHEAD = "+40s"
SHARDS = 4
DISTRIBUTED = ("--executor", "celery", "--shards", str(SHARDS))


@dataclass(frozen=True)
class Case:
    job: str
    size: int
    #: Effects counted at the provider before the first kill (a fraction of the batch's).
    kill_at: int
    #: The provider's count of this job's side effects (what kill points are chosen by).
    effects: Callable[[Cluster], int]
    assert_exact: Callable[[Cluster, str, int], None]


def _refund_effects(cluster: Cluster) -> int:
    return int(cluster.sim.stats().get("refunds_created", 0))


def _credit_effects(cluster: Cluster) -> int:
    stats = cluster.sim.stats()
    return int(stats.get("customers_created", 0) + stats.get("balance_transactions_created", 0))


def _refunds_exact(cluster: Cluster, batch_id: str, size: int) -> None:
    cluster.sim.quiet()
    assert_refunded_exactly_once(cluster.sim.refunds(), Expected.of(batch_id, size))


def _credits_exact(cluster: Cluster, batch_id: str, size: int) -> None:
    cluster.sim.quiet()
    assert_credits_exact(ProviderCredits.of_store(cluster.sim.db), expected_balances([(batch_id, size)]))


CASES = [
    Case("refund_batch", 1000, 30, _refund_effects, _refunds_exact),
    Case("credit_migration", 200, 40, _credit_effects, _credits_exact),
]


class Deployment:
    """The cluster's processes, each started as a host of its own."""

    def __init__(self, cluster: Cluster, hosts: Hosts) -> None:
        self.cluster, self.hosts = cluster, hosts

    def start(self, host: str, args: list[str], clock_offset: str | None = None) -> JobProcess:
        return JobProcess(
            args,
            self.cluster.env(DAGSTER_HOME=str(self.hosts.home(host))),
            self.cluster.logs,
            command=self.hosts.command(host, [str(JOB)], clock_offset),
        )

    def worker(self, host: str, clock_offset: str | None = None) -> JobProcess:
        p = self.start(host, ["worker", "--concurrency", "2"], clock_offset)
        self.cluster.workers.append(p)  # killed by group at teardown, as every cluster worker
        wait_until(
            lambda: "ready." in p.stderr or p.proc.poll() is not None,
            timeout=120,
            what=f"the worker on {host} to be ready",
        )
        assert p.proc.poll() is None, p.tail()
        return p


class ProgressWatch:
    """The batch's progress as the test reads it from the shared database while the batch runs."""

    def __init__(self, reader: InstanceReader, batch_id: str) -> None:
        self.reader, self.batch_id = reader, batch_id
        self.seen: list[tuple[int, int, int, float]] = []  # (step, done, of, percent_complete)

    def sample(self) -> None:
        status = self.reader.status(self.batch_id)
        progress = (status or {}).get("progress") or {}
        if status is not None and progress.get("of"):
            self.seen.append(
                (
                    int(progress["step"]),
                    int(progress["done"]),
                    int(progress["of"]),
                    status["percent_complete"],
                )
            )

    def assert_consistent(self) -> None:
        """Counted progress was seen; the batch's percentage never went back, across the kills and
        the resume; within a step ``done`` (the shards' sum) never went back nor passed ``of``."""
        assert self.seen, "no counted progress was ever read"
        percents = [p for *_, p in self.seen]
        assert percents == sorted(percents), self.seen
        for step in {s for s, *_ in self.seen}:
            counts = [(done, of) for s, done, of, _ in self.seen if s == step]
            assert [d for d, _ in counts] == sorted(d for d, _ in counts), (step, counts)
            assert all(d <= of for d, of in counts), (step, counts)


@pytest.fixture
def hosts(cluster: Cluster, tmp_path: Path) -> Hosts:
    why = private_mounts_available()
    if why is not None:
        if os.environ.get("CI"):
            pytest.fail(why)
        pytest.skip(why)
    if faketime_command() is None:
        pytest.skip("faketime is not installed: scripts/setup.sh --with-postgres installs it")
    root = tmp_path / "hosts"
    root.mkdir()
    return Hosts(root, cluster.home / "dagster.yaml")


@pytest.mark.timeout(600)
# The credit migration repeats the proof the refund batch makes on the same hosts: --full runs it.
@pytest.mark.parametrize(
    "case",
    [
        pytest.param(c, id=c.job, marks=[pytest.mark.full] if c.job == "credit_migration" else [])
        for c in CASES
    ],
)
def test_a_sharded_batch_on_separate_hosts_survives_a_worker_and_its_orchestrator(
    case: Case, cluster: Cluster, reader: InstanceReader, hosts: Hosts
) -> None:
    # One request in flight per task; the provider fast while the batch prepares (the refund job's
    # synthetic invoices are charges), slow from its first effect: the sharded step lasts seconds.
    cluster.extra_env.update({"DURABLE_CONCURRENCY": 1})
    cluster.sim.configure(latency_ms=10)
    deployment = Deployment(cluster, hosts)
    deployment.worker("worker-a")
    deployment.worker("worker-b", clock_offset=AHEAD)
    batch_id = f"hosts-{case.job}"
    run = deployment.start(
        "orchestrator",
        [*("run", "--job", case.job, "--id", batch_id, "--size", str(case.size)), *DISTRIBUTED],
    )
    watch = ProgressWatch(reader, batch_id)

    slowed: list[int] = []
    with step_leases(cluster) as store:

        def a_shard_past(effects: int) -> Any:
            watch.sample()
            assert run.proc.poll() is None, f"the batch ended before the kill\n{run.tail()}"
            counted = case.effects(cluster)
            if counted and not slowed:
                cluster.sim.configure(latency_ms=150)
                slowed.append(counted)
            if counted < effects:
                return None
            return running_shard_worker(cluster, store, newest_run_id(reader, batch_id))

        victim = wait_until(
            lambda: a_shard_past(case.kill_at),
            timeout=240,
            what="a worker running a shard",
            detail=run.tail,
        )
        cluster.kill_worker(victim)
        killed_at = case.effects(cluster)
        # The orchestrator dies while the batch is still going, after some more effects.
        wait_until(
            lambda: (watch.sample(), case.effects(cluster) > killed_at or run.proc.poll() is not None)[1],
            timeout=240,
            what="more effects after the worker's loss",
            detail=run.tail,
        )
        assert run.proc.poll() is None, f"the batch ended before the orchestrator's kill\n{run.tail()}"
        kill_group(run.pid, signal.SIGKILL)
        run.proc.wait(timeout=scaled(30))
    deployment.worker("worker-c")  # the lost worker's replacement, on a host of its own

    attempts = resume_until_accepted(
        batch_id,
        cluster.env(DAGSTER_HOME=str(hosts.home("resumer"))),
        cluster.logs,
        reader,
        timeout=300 + 4 * STEP_LEASE_TTL_S,
        command=hosts.command("resumer", [str(JOB)]),
    )
    watch.sample()
    assert attempts[-1].proc.returncode == EXIT_OK, attempts[-1].tail()

    status = status_of(cluster, batch_id)
    assert status["status"] == "succeeded", status
    assert all(s["status"] == "completed" for s in status["steps"]), status["steps"]
    case.assert_exact(cluster, batch_id, case.size)
    watch.assert_consistent()
    # Nothing of any host is visible outside it: the hosts' folder is empty here.
    assert list(hosts.root.iterdir()) == []
    if case.job == "credit_migration":
        assert [s["step_name"] for s in status["steps"]] == list(CREDIT_STEPS)
