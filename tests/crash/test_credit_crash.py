"""Slow tier for the second durable job, `credit_migration`: real `job` processes, real SIGKILL.

The refund job's crash tier (``test_crash.py``) for the credit migration. What every test asserts
is read outside the killed worker: the provider's own counters (``/_sim/stats``, or the embedded
provider's file) and its store, read with ``ProviderCredits.of_store`` once no request is in
flight. The expected balances are recomputed from the batch ids alone (``expected_balances``).
Synthetic batches share their accounts (LEG-0000001..N in every batch), so a batch run after
another over the same provider must converge on the newer credits, moving only what changed.

Nothing here sleeps in place of a condition: waits poll with a deadline (``wait_until``) or are
timed waits on the process itself.

Run: ``.venv/bin/pytest -m slow tests/crash/test_credit_crash.py`` (``DURABLE_CRASH_POINTS``,
``DURABLE_PG_CRASH_POINTS`` and ``DURABLE_CRASH_SEED`` steer the random-kill test).
"""

from __future__ import annotations

import json
import math
import os
import random
import signal
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import pytest

from tests.support.credits import (
    CREDIT_STEPS,
    ProviderCredits,
    Target,
    assert_credits_exact,
    expected_balances,
)
from tests.support.homes import pg_url_of
from tests.support.polling import wait_until

from .helpers import (
    EXIT_OK,
    EmbeddedProvider,
    JobProcess,
    Simulator,
    assert_outputs_stored,
    instance_reader,
    job,
    job_env,
    kill_at_then_finish,
    random_kill_points,
    resume_until_accepted,
)

pytestmark = pytest.mark.slow

JOB_NAME = "credit_migration"
CRASH_POINTS = random_kill_points()
#: Postgres repeats the same seeded points, fewer of them: each batch costs it more process startup.
PG_CRASH_POINTS = int(os.environ.get("DURABLE_PG_CRASH_POINTS", str(max(CRASH_POINTS // 2, 1))))
CRASH_SEED = int(os.environ.get("DURABLE_CRASH_SEED", "20261201"))
STEPS = CREDIT_STEPS


def _run_args(batch_id: str, size: int) -> list[str]:
    return ["run", "--job", JOB_NAME, "--id", batch_id, "--size", str(size)]


def _alive(p: JobProcess) -> bool:
    return p.proc.poll() is None


def _status_cli(batch_id: str, env: Mapping[str, str], logs: Path) -> dict[str, Any]:
    p = job(["status", "--id", batch_id, "--json"], env, logs)
    assert p.proc.returncode == EXIT_OK, p.tail()
    return dict(json.loads(p.stdout))


def _moves(before: Mapping[str, Target], after: Mapping[str, Target]) -> int:
    """Balance transactions a batch must create to take the provider from ``before`` to ``after``:
    one per account whose target differs from the balance it had (0 for an account new to it)."""
    return sum(
        1
        for acct, target in after.items()
        if target.balance_cents != (before[acct].balance_cents if acct in before else 0)
    )


def _assert_batch_complete(status: Mapping[str, Any], home: Path, batch_id: str) -> None:
    """Succeeded, every step completed with its stored output, nothing held for review."""
    assert status["job"] == JOB_NAME, status
    assert status["status"] == "succeeded", status
    assert [s["step_name"] for s in status["steps"]] == list(STEPS), status["steps"]
    assert [s["status"] for s in status["steps"]] == ["completed"] * len(STEPS), status["steps"]
    assert_outputs_stored(status, home)
    assert status.get("held_for_review", 0) == 0, status


def _sim_credits(sim: Simulator) -> tuple[dict[str, int], ProviderCredits]:
    """The simulator's counters and store, once the requests of any killed worker have landed."""
    stats = sim.quiet()
    return stats, ProviderCredits.of_store(sim.db)


# --- 1 ------------------------------------------------------------------------------------------


def test_resume_after_kill_after_step_2(home: Path, tmp_path: Path) -> None:
    """SIGKILL once step 2 has committed; `job resume` continues from step 3 and never re-runs 1-2."""
    batch, size = "credit-kill-after-step-2", 300
    expected = expected_balances([(batch, size)])
    slow = job_env(home, DURABLE_STEP_DELAY_S=1.0)  # embedded provider (payments.db in the instance)
    with instance_reader(home) as reader:
        worker = JobProcess(_run_args(batch, size), slow, tmp_path)
        reader.kill_after_step(worker, batch, 2)

        attempts = resume_until_accepted(batch, job_env(home), tmp_path, reader)
    assert attempts[-1].proc.returncode == EXIT_OK, attempts[-1].tail()

    status = _status_cli(batch, job_env(home), tmp_path)
    _assert_batch_complete(status, home, batch)
    assert [s["executions"] for s in status["steps"][:2]] == [1, 1], status["steps"]
    assert len(status["run_ids"]) == 2, status["run_ids"]
    provider = EmbeddedProvider(home)
    stats = provider.stats()
    assert stats["customers_created"] == len(expected)
    assert stats["balance_transactions_created"] == _moves({}, expected)
    assert_credits_exact(ProviderCredits.of_store(provider.path), expected)


# --- 2 ------------------------------------------------------------------------------------------


def test_kill_inside_apply_step(home: Path, tmp_path: Path, simulator: Callable[..., Simulator]) -> None:
    """SIGKILL while balances move; the resume creates only the missing transactions."""
    batch, size = "credit-kill-in-apply", 300
    expected = expected_balances([(batch, size)])
    n = _moves({}, expected)
    sim = simulator(latency_ms=30)
    env = job_env(home, payments_url=sim.url, DURABLE_CONCURRENCY=4)
    with instance_reader(home) as reader:
        worker = JobProcess(_run_args(batch, size), env, tmp_path)
        before = sim.kill_inside(worker, "balance_transactions_created", of=n)
        assert before["customers_created"] == len(expected), before
        reader.assert_interrupted_in(batch, 5)

        sim.configure(latency_ms=0)  # the kill has landed; the resume need not be slow
        attempts = resume_until_accepted(batch, env, tmp_path, reader)
    assert attempts[-1].proc.returncode == EXIT_OK, attempts[-1].tail()

    after, credits = _sim_credits(sim)
    assert after["balance_transactions_created"] == n, (after, n)
    assert after["customers_created"] == len(expected), "the resume created customers"
    # A replay answers a key whose transaction already existed: the resume re-sends at most the
    # ones the dead worker had sent (its unrecorded chunk), never a whole batch again.
    replays = after["idempotent_replays"] - before["idempotent_replays"]
    assert replays <= before["balance_transactions_created"], (before, after)
    assert_credits_exact(credits, expected)

    status = _status_cli(batch, env, tmp_path)
    _assert_batch_complete(status, home, batch)
    assert [s["executions"] for s in status["steps"]][:5] == [1, 1, 1, 1, 2], status["steps"]
    print(f"\nkilled at {before['balance_transactions_created']}/{n} transactions; resume replays: {replays}")


# --- 3 ------------------------------------------------------------------------------------------


@pytest.mark.timeout(240 + 45 * CRASH_POINTS)
def test_random_kill_points(home: Path, tmp_path: Path, simulator: Callable[..., Simulator]) -> None:
    """Kill batches at seeded random moments; after each resume every balance is exact.

    As in the refund tier: T is a batch that is not killed, measured on this machine, and each
    kill point is a seeded moment of T after `job run` starts. Process startup (until the run
    exists) is about half of T here, so one point in five is drawn from it and the others from
    the rest of T: points spread over startup, all seven steps and the end of the run. A kill before
    the run exists is answered by `job run` again; a batch that finished before its kill must make
    `job resume` a no-op. Every batch migrates the same accounts, so each one must converge on its
    own credits, creating exactly one transaction per moved balance.
    """
    size = 200
    sim = simulator(latency_ms=5)
    env = job_env(home, payments_url=sim.url, lease_ttl_s=1.5, DURABLE_CONCURRENCY=4)
    rng = random.Random(CRASH_SEED)
    history: list[tuple[str, int]] = []
    transactions = 0
    phases: list[str] = []

    def check(reader: Any, batch: str) -> None:
        nonlocal transactions
        before = expected_balances(history)
        history.append((batch, size))
        expected = expected_balances(history)
        transactions += _moves(before, expected)
        status = reader.status(batch)
        assert status is not None
        _assert_batch_complete(status, home, batch)
        stats, credits = _sim_credits(sim)
        assert stats["balance_transactions_created"] == transactions, (batch, phases[-1:], stats)
        assert stats["customers_created"] == len(expected), (batch, phases[-1:], stats)
        assert_credits_exact(credits, expected)

    with instance_reader(home) as reader:
        # The first batch also creates the instance's storages and every customer; T is measured
        # on the second, which (like every later one) finds them.
        warmup = job(_run_args("credit-warmup", size), env, tmp_path)
        assert warmup.proc.returncode == EXIT_OK, warmup.tail()
        check(reader, "credit-warmup")
        started = time.monotonic()
        calibration = JobProcess(_run_args("credit-calibration", size), env, tmp_path)
        wait_until(
            lambda: reader.has_runs("credit-calibration") or not _alive(calibration),
            timeout=120,
            interval=0.02,
            what="the calibration run to exist",
        )
        startup = time.monotonic() - started
        assert calibration.wait(180) == EXIT_OK, calibration.tail()
        horizon = time.monotonic() - started
        check(reader, "credit-calibration")

        points = PG_CRASH_POINTS if pg_url_of(home) else CRASH_POINTS
        for i in range(points):
            batch = f"credit-crash-{i:02d}"
            delay = rng.uniform(0.0, startup) if rng.random() < 0.2 else rng.uniform(startup, horizon)
            worker = JobProcess(_run_args(batch, size), env, tmp_path)
            phase, finisher = kill_at_then_finish(
                worker, delay, batch, env, tmp_path, reader, size=size, job_name=JOB_NAME
            )
            phases.append(phase)
            assert finisher.proc.returncode == EXIT_OK, f"{batch} killed {phase}\n{finisher.tail()}"
            check(reader, batch)
    print(
        f"\nT={horizon:.2f} s (run exists at {startup:.2f} s); seed {CRASH_SEED}; {transactions} "
        f"transactions; kill points: {phases}"
    )


# --- 4 ------------------------------------------------------------------------------------------


def test_lost_responses_and_5xx(home: Path, tmp_path: Path, simulator: Callable[..., Simulator]) -> None:
    """Lost responses (committed, then the connection dropped) and 500s on every route, no crash.

    Every customer creation, balance read and balance transaction is exposed to both faults; the
    batch must still succeed with one customer per account and every balance exact.
    """
    batch, size = "credit-lossy", 300
    expected = expected_balances([(batch, size)])
    sim = simulator(lost_response_rate=0.2, error_rate=0.1, seed=1)
    env = job_env(home, payments_url=sim.url)
    run = job(_run_args(batch, size), env, tmp_path, timeout=240)
    assert run.proc.returncode == EXIT_OK, run.tail()

    sim.configure(lost_response_rate=0.0, error_rate=0.0)  # the test's own reads are not faulted
    stats, credits = _sim_credits(sim)
    assert stats["customers_created"] == len(expected), stats
    assert stats["balance_transactions_created"] == _moves({}, expected), stats
    assert stats["idempotent_replays"] > 0, "no lost response was retried: the faults did not bite"
    assert_credits_exact(credits, expected)
    _assert_batch_complete(_status_cli(batch, env, tmp_path), home, batch)


# --- 5 ------------------------------------------------------------------------------------------


def test_next_night_converges_after_crash(
    home: Path, tmp_path: Path, simulator: Callable[..., Simulator]
) -> None:
    """Night A succeeds; night B (same accounts, ~10% new credits) is killed mid-apply and resumed.

    B creates one transaction per balance whose target moved since A, and none for the others;
    C, B's very export under a new id, then finds nothing to do: no customer, no transaction.
    """
    from durable_assets.credit_migration.synthetic import synthetic_accounts

    size = 300
    a, b, c = "credit-night-a", "credit-night-b", "credit-night-c"
    after_a = expected_balances([(a, size)])
    after_b = expected_balances([(a, size), (b, size)])
    moved = _moves(after_a, after_b)
    assert 0 < moved < len(after_b), moved
    sim = simulator()
    env = job_env(home, payments_url=sim.url, DURABLE_CONCURRENCY=4)

    night_a = job(_run_args(a, size), env, tmp_path)
    assert night_a.proc.returncode == EXIT_OK, night_a.tail()
    at_a, credits = _sim_credits(sim)
    assert at_a["balance_transactions_created"] == _moves({}, after_a), at_a
    assert_credits_exact(credits, after_a)

    # B moves few balances: once its plan is committed, each request is slowed down so the kill
    # lands inside its apply step (30 ms until then keeps the steps before it short).
    sim.configure(latency_ms=30)
    k = max(math.ceil(0.3 * moved), 1)
    with instance_reader(home) as reader:
        worker = JobProcess(_run_args(b, size), env, tmp_path)
        wait_until(
            lambda: reader.step_completed(b, 4) or not _alive(worker),
            timeout=180,
            interval=0.02,
            what="night B's plan (step 4) to complete",
        )
        sim.configure(latency_ms=150)
        assert _alive(worker), f"night B ended before its apply step\n{worker.tail()}"
        wait_until(
            lambda: (
                sim.stats()["balance_transactions_created"] - at_a["balance_transactions_created"] >= k
                or not _alive(worker)
            ),
            timeout=240,
            interval=0.01,
            what=f"{k} of night B's balance transactions",
        )
        worker.sigkill()
        assert worker.proc.returncode == -signal.SIGKILL, f"night B ended before the kill\n{worker.tail()}"
        at_kill = sim.quiet()
        killed_at = at_kill["balance_transactions_created"] - at_a["balance_transactions_created"]
        assert k <= killed_at < moved, (killed_at, moved)
        reader.assert_interrupted_in(b, 5)

        sim.configure(latency_ms=0)
        attempts = resume_until_accepted(b, env, tmp_path, reader)
        assert attempts[-1].proc.returncode == EXIT_OK, attempts[-1].tail()

        at_b, credits = _sim_credits(sim)
        created_by_b = at_b["balance_transactions_created"] - at_a["balance_transactions_created"]
        assert created_by_b == moved, (created_by_b, moved, at_a, at_b)
        assert at_b["customers_created"] == len(after_b), at_b
        assert_credits_exact(credits, after_b)
        status_b = reader.status(b)
        assert status_b is not None
        _assert_batch_complete(status_b, home, b)
        assert [s["executions"] for s in status_b["steps"]][:5] == [1, 1, 1, 1, 2], status_b["steps"]

        # C: night B's export, byte for byte, under a new batch id.
        export = tmp_path / "night-b-export.csv"
        synthetic_accounts(b, size).to_csv(export, index=False)
        night_c = job(["run", "--job", JOB_NAME, "--id", c, "--input", str(export)], env, tmp_path)
        assert night_c.proc.returncode == EXIT_OK, night_c.tail()
        at_c, credits = _sim_credits(sim)
        assert at_c["balance_transactions_created"] == at_b["balance_transactions_created"], (at_b, at_c)
        assert at_c["customers_created"] == at_b["customers_created"], (at_b, at_c)
        assert_credits_exact(credits, after_b)
        status_c = reader.status(c)
        assert status_c is not None
        _assert_batch_complete(status_c, home, c)
    print(f"\nnight B: {moved} balances moved of {len(after_b)}, killed after {killed_at}")


# --- 6 ------------------------------------------------------------------------------------------


def test_kill_inside_customers_step(home: Path, tmp_path: Path, simulator: Callable[..., Simulator]) -> None:
    """SIGKILL while customers are being created; the resume finds them: 0 duplicate customers."""
    batch, size = "credit-kill-in-customers", 300
    expected = expected_balances([(batch, size)])
    n = len(expected)
    sim = simulator(latency_ms=30)
    env = job_env(home, payments_url=sim.url, DURABLE_CONCURRENCY=4)
    with instance_reader(home) as reader:
        worker = JobProcess(_run_args(batch, size), env, tmp_path)
        before = sim.kill_inside(worker, "customers_created", of=n)
        assert before["balance_transactions_created"] == 0, before
        reader.assert_interrupted_in(batch, 3)

        sim.configure(latency_ms=0)
        attempts = resume_until_accepted(batch, env, tmp_path, reader)
    assert attempts[-1].proc.returncode == EXIT_OK, attempts[-1].tail()

    after, credits = _sim_credits(sim)
    assert after["customers_created"] == n, (after, n)
    assert after["balance_transactions_created"] == _moves({}, expected), after
    replays = after["idempotent_replays"] - before["idempotent_replays"]
    assert replays <= before["customers_created"], (before, after)
    assert_credits_exact(credits, expected)

    status = _status_cli(batch, env, tmp_path)
    _assert_batch_complete(status, home, batch)
    assert [s["executions"] for s in status["steps"]][:3] == [1, 1, 2], status["steps"]
    print(f"\nkilled at {before['customers_created']}/{n} customers; resume replays: {replays}")
