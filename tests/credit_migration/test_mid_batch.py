"""The provider changes while a credit migration runs (#34 item 1): every change is its account's.

Through the real `job` CLI against a Stripe-compatible simulator, on SQLite and on Postgres. A
`job run` freezes itself at a named boundary (``DURABLE_CRASH_AT=POINT:N:stop``, SIGSTOP: every
thread and lock kept), the test changes the provider the way a person or another tool would, and
thaws it. Three accounts change at once, one each way: its customer deleted, a second customer made
naming it (duplicated), its ``metadata.legacy_account_id`` changed by hand (re-labelled); at each
point: during step 3 (after it listed the customers), between steps 3 and 4, during step 5 (before
the three adjustments are sent) and after it (before its check), and between nights. Each time the
batch writes its report and ends exit 4: the three accounts held with a note saying what happened
at the provider and naming the customers involved, every other account exact (balance transactions
counted in the simulator's store, which outlives every process); after a person's fix (a
replacement customer, the duplicate deleted, the label set back) the next night is exact.

The worker runs one provider request at a time (``DURABLE_CONCURRENCY=1``), so at a freeze on the
Nth request exactly N-1 were sent: which customers exist and which balances moved is known.
"""

from __future__ import annotations

import os
import signal
import sqlite3
from collections.abc import Iterator
from enum import StrEnum
from pathlib import Path
from typing import Any

import pytest
import stripe

from tests.support.credits import (
    ProviderCredits,
    Target,
    assert_credits_exact,
    expected_balances,
    migration_report,
)
from tests.support.homes import clean_env, make_home
from tests.support.polling import wait_until
from tests.support.processes import Process
from tests.support.simulator import ThreadedSimulator

from ..conftest import job_cli

API_KEY = "sk_test_mid_batch"
SIZE = 10


class Point(StrEnum):
    """Where the provider changes, relative to the batch's steps."""

    DURING_STEP_3 = "during-step-3"  # step 3 listed the customers and created some of them
    BETWEEN_3_AND_4 = "between-3-and-4"
    DURING_STEP_5 = "during-step-5"  # one adjustment sent, the three changed accounts' not yet
    AFTER_STEP_5 = "after-step-5"  # every adjustment applied, step 5's check not run yet
    BETWEEN_NIGHTS = "between-nights"


class Change(StrEnum):
    DELETED = "deleted"
    DUPLICATED = "duplicated"
    RELABELLED = "relabelled"


#: What each change's held note must say happened at the provider.
SAYS = {
    Change.DELETED: "was deleted at the provider",
    Change.DUPLICATED: "was duplicated at the provider",
    Change.RELABELLED: "was changed at the provider by hand",
}


@pytest.fixture(params=["sqlite", "postgres"])
def home(request: pytest.FixtureRequest, tmp_path: Path) -> Path:
    pg_url = None if request.param == "sqlite" else str(request.getfixturevalue("pg_database"))
    return make_home(tmp_path / "home", pg_url)


@pytest.fixture
def sim(tmp_path: Path) -> Iterator[ThreadedSimulator]:
    with ThreadedSimulator(tmp_path / "sim.db", api_keys=[API_KEY]) as server:
        yield server


def _env(home: Path, sim: ThreadedSimulator, **extra: object) -> dict[str, str]:
    return clean_env(
        home, DURABLE_PAYMENTS_URL=sim.url, STRIPE_API_KEY=API_KEY, DURABLE_CONCURRENCY=1, **extra
    )


def _client(sim: ThreadedSimulator) -> stripe.StripeClient:
    return stripe.StripeClient(
        API_KEY, base_addresses={"api": sim.url}, max_network_retries=0, http_client=stripe.RequestsClient()
    )


def _run_args(batch_id: str) -> list[str]:
    return ["run", "--job", "credit_migration", "--id", batch_id, "--size", str(SIZE)]


def _run(home: Path, sim: ThreadedSimulator, batch_id: str) -> Any:
    return job_cli(*_run_args(batch_id), env=_env(home, sim))


def _frozen(pid: int) -> bool:
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "T"


def _targets(*nights: str) -> dict[str, Target]:
    return expected_balances([(n, SIZE) for n in nights])


def _moves(acct: str, nights: tuple[str, ...]) -> int:
    """How many balance transactions the nights make for an account: one per change of its target,
    from a balance of 0."""
    moves, current = 0, 0
    for night in nights:
        target = _targets(night)[acct].balance_cents
        moves, current = moves + (target != current), target
    return moves


def _store(sim: ThreadedSimulator) -> Path:
    return Path(sim.server.store.path)


def _transactions(sim: ThreadedSimulator, customer_id: str) -> int:
    """A customer's balance transactions, read from the simulator's file (a deleted customer's too,
    which no API lists any more)."""
    with sqlite3.connect(_store(sim), timeout=30) as conn:
        (n,) = conn.execute(
            "SELECT count(*) FROM customer_balance_transactions WHERE customer = ?", (customer_id,)
        ).fetchone()
    return int(n)


def _relabel(sim: ThreadedSimulator, customer_id: str, legacy_id: str) -> None:
    """A person edits the customer's metadata at the provider, as a support tool would (the SDK)."""
    _client(sim).v1.customers.update(customer_id, params={"metadata": {"legacy_account_id": legacy_id}})


def _freeze_at(point: Point, accounts: int) -> str:
    """The boundary a night-1 `job run` stops itself at (step 3 sends one create per account, step
    5 one adjustment per account with credit, in that order, one at a time)."""
    return {
        Point.DURING_STEP_3: f"before_provider_request:{accounts - 2}:stop",  # the three made, not all
        Point.BETWEEN_3_AND_4: "step_start:4:stop",
        Point.DURING_STEP_5: f"before_provider_request:{accounts + 2}:stop",  # one adjustment sent
        Point.AFTER_STEP_5: "step_body_done:5:stop",
    }[point]


def _change(sim: ThreadedSimulator, accounts: list[str]) -> dict[Change, tuple[str, dict[str, str]]]:
    """Delete, duplicate and re-label the customers of three accounts that have one now and whose
    balance has not moved yet (if any has not): {change: (account, the ids involved)}."""
    client = _client(sim)
    customers = ProviderCredits.of_store(_store(sim)).customers
    have = [a for a in accounts if a in customers]
    unmoved = [a for a in have if _transactions(sim, customers[a][0]["id"]) == 0]
    chosen = (unmoved if len(unmoved) >= 3 else have)[:3]
    assert len(chosen) == 3, f"only {have} have a customer"
    deleted, duplicated, relabelled = chosen
    out: dict[Change, tuple[str, dict[str, str]]] = {}
    gone = customers[deleted][0]["id"]
    client.v1.customers.delete(gone)
    out[Change.DELETED] = (deleted, {"customer": gone})
    ours = customers[duplicated][0]["id"]
    second = client.v1.customers.create(
        params={"email": "support@example.com", "metadata": {"legacy_account_id": duplicated}}
    ).id
    out[Change.DUPLICATED] = (duplicated, {"customer": ours, "second": str(second)})
    moved = customers[relabelled][0]["id"]
    _relabel(sim, moved, f"{relabelled}-closed")
    out[Change.RELABELLED] = (relabelled, {"customer": moved})
    return out


def _fix(sim: ThreadedSimulator, changed: dict[Change, tuple[str, dict[str, str]]]) -> None:
    """What a person does after reading the notes: a replacement for the deleted customer (Stripe
    has no undelete), the second customer deleted, the label set back."""
    client = _client(sim)
    acct, _ = changed[Change.DELETED]
    client.v1.customers.create(
        params={"email": "support@example.com", "metadata": {"legacy_account_id": acct}}
    )
    client.v1.customers.delete(changed[Change.DUPLICATED][1]["second"])
    acct, ids = changed[Change.RELABELLED]
    _relabel(sim, ids["customer"], acct)


def _credited(nights: tuple[str, ...]) -> list[str]:
    """The accounts whose first night's target is a balance to move (their changes then matter)."""
    return [a for a, t in _targets(nights[0]).items() if t.balance_cents != 0]


@pytest.mark.slow
@pytest.mark.parametrize("point", list(Point), ids=str)
def test_a_provider_change_mid_batch_holds_its_account_alone(
    point: Point, home: Path, sim: ThreadedSimulator, tmp_path: Path
) -> None:
    nights: tuple[str, ...] = ("n1",)
    if point is Point.BETWEEN_NIGHTS:
        first = _run(home, sim, "n0")
        assert first.returncode == 0, (first.stdout, first.stderr)
        nights = ("n0", "n1")
    accounts = _credited(nights)
    before: dict[str, int] = {}
    if point is Point.BETWEEN_NIGHTS:
        changed = _change(sim, accounts)
        before = {ids["customer"]: _transactions(sim, ids["customer"]) for _a, ids in changed.values()}
        run = _run(home, sim, "n1")
        rc, out = run.returncode, (run.stdout, run.stderr)
    else:
        spec = _freeze_at(point, len(_targets("n1")))
        worker = Process(
            [str(Path(".venv/bin/job").resolve()), *_run_args("n1")],
            _env(home, sim, DURABLE_CRASH_AT=spec),
            tmp_path / "n1.out",
        )
        wait_until(
            lambda: not worker.alive() or _frozen(worker.pid), 120, what=f"the worker to stop at {spec}"
        )
        assert worker.alive(), f"the run ended before {spec}:\n{worker.tail()}"
        changed = _change(sim, accounts)
        before = {ids["customer"]: _transactions(sim, ids["customer"]) for _a, ids in changed.values()}
        os.kill(worker.pid, signal.SIGCONT)
        rc, out = worker.wait(180), (worker.tail(),)

    assert rc == 4, out
    report = migration_report(home, "n1")
    for change, (acct, ids) in changed.items():
        row = report[acct]
        assert row["status"] == "held_for_review", (change, row)
        assert SAYS[change] in row["review_note"], (change, row["review_note"])
        assert all(i in row["review_note"] for i in ids.values()), (change, ids, row["review_note"])
        # Nothing moved for it after the change, but the one adjustment already on its way in step 5
        # to a customer that still stood (a duplicated or re-labelled one).
        sent = point is Point.DURING_STEP_5 and change is not Change.DELETED
        assert _transactions(sim, ids["customer"]) == before[ids["customer"]] + sent, (change, row)
        if change is Change.DUPLICATED:
            assert _transactions(sim, ids["second"]) == 0
    held = {acct for acct, _ in changed.values()}
    others = {a: t for a, t in _targets(*nights).items() if a not in held}
    credits = ProviderCredits.of_store(_store(sim))
    assert_credits_exact(
        ProviderCredits({a: credits.customers[a] for a in others}, credits.transactions), others
    )
    for acct in others:
        (customer,) = credits.customers[acct]
        assert len(credits.transactions[customer["id"]]) == _moves(acct, nights), acct
    assert {a for a, r in report.items() if r["status"] == "held_for_review"} == held

    _fix(sim, changed)
    after = (*nights, "n2")
    fixed = _run(home, sim, "n2")
    assert fixed.returncode == 0, (fixed.stdout, fixed.stderr)
    assert_credits_exact(ProviderCredits.of_store(_store(sim)), _targets(*after))


@pytest.mark.slow
@pytest.mark.parametrize("home", ["sqlite"], indirect=True)
def test_an_old_unanswered_intent_whose_customer_was_deleted_is_looked_up_then_held_never_sent(
    home: Path, sim: ThreadedSimulator, tmp_path: Path
) -> None:
    """Killed with step 5's first adjustment committed as an intent, unanswered; the customer is
    deleted; the resume treats every intent as older than the provider's key retention, so it
    looks each up before sending: the deleted customer's is held saying its outcome is unknown,
    never sent; the rest are exact."""
    accounts = len(_targets("n1"))
    worker = Process(
        [str(Path(".venv/bin/job").resolve()), *_run_args("n1")],
        _env(home, sim, DURABLE_CRASH_AT=f"before_provider_request:{accounts + 1}", DURABLE_LEASE_TTL_S=3),
        tmp_path / "n1.out",
    )
    assert worker.wait(180) == -signal.SIGKILL, worker.tail()
    customers = ProviderCredits.of_store(_store(sim)).customers
    acct = next(a for a in _credited(("n1",)) if a in customers)
    gone = customers[acct][0]["id"]
    _client(sim).v1.customers.delete(gone)
    requests = sim.server.store.stats()["balance_transactions_created"]

    resumed = job_cli(
        "resume",
        "--id",
        "n1",
        "--wait",
        env=_env(home, sim, DURABLE_KEY_RETENTION_HOURS=0.000001, DURABLE_LEASE_TTL_S=3),
    )

    assert resumed.returncode == 4, (resumed.stdout, resumed.stderr)
    row = migration_report(home, "n1")[acct]
    assert row["status"] == "held_for_review" and gone in row["review_note"], row
    assert "before this adjustment's answer was recorded" in row["review_note"], row
    assert _transactions(sim, gone) == 0
    others = {a: t for a, t in _targets("n1").items() if a != acct}
    assert sim.server.store.stats()["balance_transactions_created"] - requests == sum(
        1 for t in others.values() if t.balance_cents
    )
    credits = ProviderCredits.of_store(_store(sim))
    assert_credits_exact(
        ProviderCredits({a: credits.customers[a] for a in others}, credits.transactions), others
    )


@pytest.mark.slow
def test_a_resume_after_a_persons_fix_reads_the_provider_again(
    home: Path, sim: ThreadedSimulator, tmp_path: Path
) -> None:
    """The worker dies between steps 3 and 4, right after the three changes; a person fixes them
    before `job resume`. Step 3's committed frame still names the customers it found, but step 4
    reads the provider again: the duplicated and re-labelled accounts, fixed, migrate in the resume
    itself; the deleted one, whose replacement only step 3 adopts, is held saying so and naming the
    replacement, and the next night adopts it. Every balance exact."""
    worker = Process(
        [str(Path(".venv/bin/job").resolve()), *_run_args("n1")],
        _env(home, sim, DURABLE_CRASH_AT="step_start:4:stop", DURABLE_LEASE_TTL_S=3),
        tmp_path / "n1.out",
    )
    wait_until(lambda: not worker.alive() or _frozen(worker.pid), 120, what="the worker to stop at step 4")
    assert worker.alive(), worker.tail()
    changed = _change(sim, _credited(("n1",)))
    worker.sigkill()
    _fix(sim, changed)

    resumed = job_cli("resume", "--id", "n1", "--wait", env=_env(home, sim, DURABLE_LEASE_TTL_S=3))

    assert resumed.returncode == 4, (resumed.stdout, resumed.stderr)
    report = migration_report(home, "n1")
    acct, ids = changed[Change.DELETED]
    assert {a for a, r in report.items() if r["status"] == "held_for_review"} == {acct}
    (replacement,) = ProviderCredits.of_store(_store(sim)).customers[acct]
    assert SAYS[Change.DELETED] in report[acct]["review_note"]
    assert ids["customer"] in report[acct]["review_note"] and replacement["id"] in report[acct]["review_note"]
    others = {a: t for a, t in _targets("n1").items() if a != acct}
    credits = ProviderCredits.of_store(_store(sim))
    assert_credits_exact(
        ProviderCredits({a: credits.customers[a] for a in others}, credits.transactions), others
    )
    assert _transactions(sim, ids["customer"]) == 0 and replacement["balance"] == 0

    fixed = _run(home, sim, "n2")
    assert fixed.returncode == 0, (fixed.stdout, fixed.stderr)
    assert_credits_exact(ProviderCredits.of_store(_store(sim)), _targets("n1", "n2"))
