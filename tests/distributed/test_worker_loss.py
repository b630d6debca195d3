"""Worker loss in a distributed batch: SIGKILL, SIGSTOP, the orchestrator killed, cancel.

Every test ends with the batch succeeded (by redelivery, a re-send after a lapsed step lease, or
`job resume`) and the provider's own store exact: one customer per account, no balance
transaction twice, every balance at its target (credit migration, ``assert_credits_exact``).
Kill points are chosen by what the provider has counted, not by time, and the worker killed is
the one whose pool child holds a live shard's step lease (read from the lease table), so every
kill lands inside a running shard.

Waits poll with deadlines (``wait_until``); nothing sleeps in place of a condition.
``DURABLE_DIST_KILL_BATCHES`` x ``DURABLE_DIST_KILLS_PER_BATCH`` random points (default 3 x 4),
seeded by ``DURABLE_CRASH_SEED``.
"""

from __future__ import annotations

import json
import os
import random
import signal
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest

from durable_assets.kit.leases import owner_pid
from tests.crash.helpers import EXIT_OK, InstanceReader, JobProcess, resume_until_accepted
from tests.support.credits import ProviderCredits, assert_credits_exact, expected_balances
from tests.support.polling import wait_until

from .conftest import Cluster
from .test_distributed import status_of

pytestmark = [pytest.mark.slow, pytest.mark.postgres]

JOB_NAME = "credit_migration"
KILL_BATCHES = int(os.environ.get("DURABLE_DIST_KILL_BATCHES", "3"))
KILLS_PER_BATCH = int(os.environ.get("DURABLE_DIST_KILLS_PER_BATCH", "4"))
#: Kills that must land in a running shard; a point the batch outran (its last shards ended
#: together) is made up by one more batch, at most two more.
KILLS_WANTED = min(10, KILL_BATCHES * KILLS_PER_BATCH)
SEED = int(os.environ.get("DURABLE_CRASH_SEED", "20261201"))
SIZE = 150
#: The credit migration's steps a distributed run splits into shards (its mutating steps).
SHARDED_STEPS = ("provider_customers", "applied_adjustments")
#: A slower provider and fewer requests in flight per task, so a shard lasts seconds, not 100 ms.
SLOW = {"DURABLE_CONCURRENCY": 2}


@contextmanager
def step_leases(cluster: Cluster) -> Iterator[Any]:
    from durable_assets.kit.db import DurableDatabase
    from durable_assets.kit.step_leases import StepLeaseStore

    yield StepLeaseStore(DurableDatabase(cluster.pg_url), ttl_s=3.0)


def slow(cluster: Cluster) -> None:
    cluster.extra_env.update(SLOW)
    cluster.sim.configure(latency_ms=80)


def effects(cluster: Cluster) -> int:
    stats = cluster.sim.stats()
    return stats.get("customers_created", 0) + stats.get("balance_transactions_created", 0)


def running_shard_worker(cluster: Cluster, store: Any, run_id: str | None) -> JobProcess | None:
    """The live worker whose pool child holds a live, unfinished shard lease of the batch's run."""
    if run_id is None:
        return None
    for lease in store.of_run(run_id).values():
        if "__shard_" not in lease.step_key or lease.finished or lease.lapsed:
            continue
        child = owner_pid(lease.owner)
        try:
            group = os.getpgid(child)
        except ProcessLookupError:
            continue
        for w in cluster.live_workers():
            if w.pid == group:
                return w
    return None


def a_batch_on_two_workers(cluster: Cluster, batch_id: str) -> JobProcess:
    """A batch of ``SIZE`` accounts in 4 shards on two workers, slowed so a shard lasts seconds."""
    slow(cluster)
    cluster.worker()
    cluster.worker()
    return cluster.run(JOB_NAME, batch_id, SIZE, shards=4)


def a_running_shard(
    cluster: Cluster, reader: InstanceReader, store: Any, batch_id: str, run: JobProcess
) -> JobProcess:
    """The worker running one of the batch's shards right now: the one a test kills or freezes."""
    return wait_until(
        lambda: running_shard_worker(cluster, store, newest_run_id(reader, batch_id)),
        timeout=240,
        what="a running shard",
        detail=run.tail,
    )


def a_batch_mid_shard(
    cluster: Cluster, reader: InstanceReader, batch_id: str
) -> tuple[JobProcess, JobProcess]:
    """A batch on two workers (:func:`a_batch_on_two_workers`) once one of its shards runs: its
    `job run` and the worker running that shard, the moment the loss tests strike."""
    run = a_batch_on_two_workers(cluster, batch_id)
    with step_leases(cluster) as store:
        return run, a_running_shard(cluster, reader, store, batch_id, run)


def resumed_exactly(cluster: Cluster, reader: InstanceReader, batch_id: str) -> None:
    """`job resume` until accepted finishes the batch of ``SIZE`` accounts, each effect once."""
    ends = resume_until_accepted(batch_id, cluster.env(), cluster.logs, reader)
    assert ends[-1].proc.returncode == EXIT_OK, ends[-1].tail()
    assert_exact(cluster, [(batch_id, SIZE)])


def newest_run_id(reader: InstanceReader, batch_id: str) -> str | None:
    from durable_assets.ops.status import batch_runs

    runs = batch_runs(reader.instance, batch_id)
    return runs[-1].run_id if runs else None


def finish(cluster: Cluster, reader: InstanceReader, batch_id: str, run: JobProcess) -> list[JobProcess]:
    """The batch's end: its `job run`'s own, else `job resume` until it is accepted."""
    run.wait(300)
    if run.proc.returncode == EXIT_OK:
        return [run]
    return [run, *resume_until_accepted(batch_id, cluster.env(), cluster.logs, reader)]


def effects_of(done: list[tuple[str, int]], batch: tuple[str, int]) -> int:
    """Provider effects ``batch`` must cause after ``done``: a customer per new account, a balance
    transaction per account whose target moved (synthetic batches share their accounts)."""
    before = expected_balances(done) if done else {}
    after = expected_balances([*done, batch])
    moved = sum(
        1 for a, t in after.items() if t.balance_cents != (before[a].balance_cents if a in before else 0)
    )
    return len(set(after) - set(before)) + moved


def _kill_point(
    cluster: Cluster, reader: InstanceReader, store: Any, run: JobProcess, batch_id: str, at_effects: int
) -> Any:
    """A poll: the batch ended (True), or a worker running a shard once ``at_effects`` are counted."""

    def poll() -> Any:
        if run.proc.poll() is not None:
            return True
        if effects(cluster) < at_effects:
            return None
        return running_shard_worker(cluster, store, newest_run_id(reader, batch_id))

    return poll


def assert_exact(cluster: Cluster, batches: list[tuple[str, int]]) -> None:
    for batch_id, _ in batches:
        status = status_of(cluster, batch_id)
        assert status["status"] == "succeeded", status
        assert all(s["status"] == "completed" for s in status["steps"]), status["steps"]
    cluster.sim.quiet()
    assert_credits_exact(ProviderCredits.of_store(cluster.sim.db), expected_balances(batches))


def test_sigkill_a_worker_mid_shard_at_random_points(cluster: Cluster, reader: InstanceReader) -> None:
    rng = random.Random(SEED)
    slow(cluster)
    cluster.worker()
    cluster.worker()
    batches: list[tuple[str, int]] = []
    kills = 0
    with step_leases(cluster) as store:
        b = 0
        while b < KILL_BATCHES or (kills < KILLS_WANTED and b < KILL_BATCHES + 2):
            # Each batch is larger than the last, so it has new accounts as well as moved balances.
            batch_id, size = f"dist-kill-{b}", SIZE + 50 * b
            total = effects_of(batches, (batch_id, size))
            batches.append((batch_id, size))
            base = effects(cluster)
            run = cluster.run(JOB_NAME, batch_id, size, shards=4)
            # Points among the first 80% of the batch's effects: the last shards may end together.
            points = sorted(rng.sample(range(2, max(int(total * 0.8), KILLS_PER_BATCH + 3)), KILLS_PER_BATCH))
            for point in points:
                victim = wait_until(
                    _kill_point(cluster, reader, store, run, batch_id, base + point),
                    timeout=240,
                    interval=0.05,
                    what=f"a running shard past {point} effects",
                    detail=run.tail,
                )
                if not isinstance(victim, JobProcess):
                    break  # the batch ended before this point: its remaining points are not reached
                cluster.kill_worker(victim)
                kills += 1
                cluster.worker()  # a replacement, as a supervisor would start
            ends = finish(cluster, reader, batch_id, run)
            assert ends[-1].proc.returncode == EXIT_OK, ends[-1].tail()
            b += 1
    assert_exact(cluster, batches)
    assert kills >= KILLS_WANTED, f"only {kills} kills landed in a shard in {b} batches"


def test_sigkill_the_orchestrator_while_workers_run_its_tasks(
    cluster: Cluster, reader: InstanceReader
) -> None:
    batch_id = "dist-kill-orchestrator"
    run, _ = a_batch_mid_shard(cluster, reader, batch_id)
    run.sigkill()
    assert run.proc.returncode == -signal.SIGKILL
    resumed_exactly(cluster, reader, batch_id)


def test_sigkill_a_worker_and_the_orchestrator_together(cluster: Cluster, reader: InstanceReader) -> None:
    batch_id = "dist-kill-both"
    run, victim = a_batch_mid_shard(cluster, reader, batch_id)
    run.sigkill()
    cluster.kill_worker(victim)
    cluster.worker()
    resumed_exactly(cluster, reader, batch_id)


def test_a_frozen_worker_is_replaced_and_stands_down_when_it_wakes(
    cluster: Cluster, reader: InstanceReader
) -> None:
    """SIGSTOP a worker mid-shard: its step lease lapses, the shard is sent again and finished by
    another worker; woken after the batch succeeded, the frozen execution sends nothing more."""
    batch_id = "dist-frozen"
    run = a_batch_on_two_workers(cluster, batch_id)
    with step_leases(cluster) as store:
        frozen = a_running_shard(cluster, reader, store, batch_id, run)
        os.killpg(frozen.pid, signal.SIGSTOP)
        try:
            run.wait(300)
            assert run.proc.returncode == EXIT_OK, run.tail()
            run_id = newest_run_id(reader, batch_id)
            assert run_id is not None
            # The frozen shard was sent again: its lease row names a newer attempt, which finished.
            resent = [x for x in store.of_run(run_id).values() if x.attempt >= 2]
            assert resent and all(x.finished for x in resent), store.of_run(run_id)
            after_batch = cluster.sim.quiet()
        finally:
            os.killpg(frozen.pid, signal.SIGCONT)
        # Woken, the stale execution finds its step taken over and its pool child ends itself (or
        # Celery ends it, its broker connection gone): either way before another provider request.
        wait_until(
            lambda: (
                "taken over by a newer execution" in frozen.stderr
                or "lost" in frozen.stderr.lower()
                or frozen.proc.poll() is not None
            ),
            timeout=90,
            what="the woken worker to give its stale task up",
            detail=frozen.tail,
        )
    assert_exact(cluster, [(batch_id, SIZE)])
    final = cluster.sim.quiet()
    assert final["customers_created"] == after_batch["customers_created"]
    assert final["balance_transactions_created"] == after_batch["balance_transactions_created"]


def test_cancel_reaches_the_tasks(cluster: Cluster, reader: InstanceReader) -> None:
    batch_id = "dist-cancel"
    run, _ = a_batch_mid_shard(cluster, reader, batch_id)
    # The rest of the sharded step must outlast `job cancel`'s own start (3-5 s on a loaded 2-core
    # machine): at 80 ms a request its 4 shards could all end first, once warm workers started
    # them at once, and the cancel then landed at the next step, which asserts nothing here.
    cluster.sim.configure(latency_ms=500)
    canceled = cluster.job(["cancel", "--id", batch_id])
    assert canceled.proc.returncode == EXIT_OK, canceled.tail()
    at_cancel = effects(cluster)
    cluster.sim.configure(latency_ms=80)
    run.wait(240)
    assert run.proc.returncode != EXIT_OK, run.tail()
    after = effects(cluster)
    # At most the requests already in flight when the cancel committed: 2 workers x 2 tasks x 2.
    assert after - at_cancel <= 8, (at_cancel, after)
    assert_canceled_at_a_sharded_step(cluster, batch_id, run)
    resumed_exactly(cluster, reader, batch_id)


def assert_canceled_at_a_sharded_step(cluster: Cluster, batch_id: str, run: JobProcess) -> None:
    """The canceled batch reads as an unsharded one does: the step it stopped at is skipped (not
    failed), named as the step with the cancel as its reason, in the JSON, the human status and
    `job run`'s last line; no shard asset (``<step>__shard_k_of_N``) is named anywhere."""
    status = status_of(cluster, batch_id)
    assert status["status"] == "canceled", status
    states = [(s["step_name"], s["status"]) for s in status["steps"]]
    stopped = [n for n, s in enumerate(status["steps"], 1) if s["status"] == "skipped"]
    assert len(stopped) == 1, states
    n = stopped[0]
    step = status["steps"][n - 1]
    assert step["step_name"] in SHARDED_STEPS, states
    assert [st for _name, st in states[: n - 1]] == ["completed"] * (n - 1), states
    assert [st for _name, st in states[n:]] == ["pending"] * (len(states) - n), states
    assert step["error"].startswith("BatchCanceledError: "), step
    assert status["progress"]["label"].startswith("Canceled: "), status["progress"]
    human = cluster.job(["status", "--id", batch_id])
    assert f"{n}. {step['step_name']}" in human.stdout and "why: BatchCanceledError" in human.stdout, (
        human.tail()
    )
    last = run.stderr.strip().splitlines()[-1]
    assert last.startswith(f"error: batch {batch_id} canceled at step {n} ({step['step_name']}): "), (
        run.tail()
    )
    for text in (json.dumps(status), human.stdout, last):
        assert "__shard_" not in text, text


def test_ctrl_c_of_the_orchestrator_stops_the_tasks_on_the_workers(
    cluster: Cluster, reader: InstanceReader
) -> None:
    """The signal sets a flag in the orchestrator's process only; the shards run on the workers,
    which went on to finish the whole batch. The run's stop request reaches them before their next
    request: the batch stops as interrupted (not canceled), and `job resume` finishes it exactly once."""
    batch_id = "dist-ctrl-c"
    run, _ = a_batch_mid_shard(cluster, reader, batch_id)
    os.kill(run.pid, signal.SIGINT)
    at_signal = effects(cluster)
    assert run.wait(240) == 130, run.tail()
    after = effects(cluster)
    # At most the requests already in flight when the stop committed: 2 workers x 2 tasks x 2.
    assert after - at_signal <= 8, (at_signal, after)
    assert after < effects_of([], (batch_id, SIZE)), "the whole batch ran: the signal stopped nothing"
    last = run.stderr.strip().splitlines()[-1]
    assert last.startswith("interrupted at step "), run.tail()
    assert last.endswith(f"; job resume --id {batch_id} continues it"), run.tail()
    assert status_of(cluster, batch_id)["status"] == "failed"
    resumed_exactly(cluster, reader, batch_id)


def _step_sent(reader: InstanceReader, batch_id: str) -> bool:
    run_id = newest_run_id(reader, batch_id)
    return run_id is not None and any(
        (e.message or "").startswith("Sending step") for e in reader.instance.all_logs(run_id)
    )


def test_sigterm_of_a_run_waiting_for_a_worker_exits_143_at_once(
    cluster: Cluster, reader: InstanceReader
) -> None:
    """No worker consumes the queue, so the first step waits in it. SIGTERM must not wait for a
    worker that may never come (#35: still running 60 s later): the queued task is revoked, the
    command exits 143 with its one line, and once a worker is there `job resume` finishes exactly."""
    batch_id = "dist-waiting-sigterm"
    run = cluster.run(JOB_NAME, batch_id, 40, shards=2)
    wait_until(
        lambda: _step_sent(reader, batch_id), timeout=120, what="a step sent to the queue", detail=run.tail
    )
    os.kill(run.pid, signal.SIGTERM)
    assert run.wait(30) == 143, run.tail()
    assert (
        run.stderr.strip().splitlines()[-1]
        == f"interrupted at step 1; job resume --id {batch_id} continues it"
    )
    assert effects(cluster) == 0
    cluster.worker()
    ends = resume_until_accepted(batch_id, cluster.env(), cluster.logs, reader)
    assert ends[-1].proc.returncode == EXIT_OK, ends[-1].tail()
    assert_exact(cluster, [(batch_id, 40)])
