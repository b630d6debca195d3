"""What already stands at the provider, and which provider account a batch talks to (issue #20).

Through the real `job` CLI against Stripe-compatible simulators (customers made by hand with the
official SDK, as a support agent's tool would), on SQLite and on Postgres:

- a customer made by hand for a legacy account is adopted, and its balance planned from;
- an account with two customers is held for review alone while the rest migrates (exit 4), night
  after night, until a person keeps one; then it migrates;
- a customer deleted at the provider between nights is held, never re-created;
- one instance used against two simulator accounts and the embedded provider in turn: each batch is
  exact at its own account, and a resume against another account is refused (exit 2, naming both).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import stripe

from tests.support.batches import synthetic_candidates
from tests.support.credits import (
    ProviderCredits,
    assert_credits_exact,
    expected_balances,
    migration_report,
)
from tests.support.homes import clean_env, make_home
from tests.support.simulator import ThreadedSimulator

from ..conftest import job_cli

API_KEY = "sk_test_provider_state"
SIZE = 24


@pytest.fixture
def home(request: pytest.FixtureRequest, tmp_path: Path) -> Path:
    """An instance on SQLite, or on Postgres for the tests marked ``both_backends`` (parametrized)."""
    backend = getattr(request, "param", "sqlite")
    pg_url = None if backend == "sqlite" else str(request.getfixturevalue("pg_database"))
    return make_home(tmp_path / "home", pg_url)


#: The tests whose claims differ by backend (the ledger's new key, the batch's binding) run on both;
#: the others exercise the pipeline's rules, which no backend changes, on SQLite only (each is a
#: handful of real batches: minutes under a loaded CI).
both_backends = pytest.mark.parametrize("home", ["sqlite", "postgres"], indirect=True)


@pytest.fixture
def sim(tmp_path: Path) -> Iterator[ThreadedSimulator]:
    with ThreadedSimulator(tmp_path / "sim-a.db", api_keys=[API_KEY]) as server:
        yield server


def _env(home: Path, sim: ThreadedSimulator | None, **extra: object) -> dict[str, str]:
    provider: dict[str, object] = (
        {"DURABLE_PAYMENTS_URL": sim.url, "STRIPE_API_KEY": API_KEY} if sim is not None else {}
    )
    return clean_env(home, **provider, **extra)


def _client(sim: ThreadedSimulator) -> stripe.StripeClient:
    return stripe.StripeClient(
        API_KEY, base_addresses={"api": sim.url}, max_network_retries=0, http_client=stripe.RequestsClient()
    )


def _accounts(batch_id: str, size: int = SIZE) -> list[tuple[str, str, int]]:
    """(legacy id, currency, credit cents) of the batch's valid accounts, in file order."""
    from durable_assets.credit_migration.synthetic import synthetic_accounts
    from durable_assets.credit_migration.validation import validate_accounts

    valid = validate_accounts(synthetic_accounts(batch_id, size)).valid
    return [
        (str(a), str(c), int(cr))
        for a, c, cr in zip(valid["legacy_account_id"], valid["currency"], valid["credit_cents"], strict=True)
    ]


def _hand_made(
    client: stripe.StripeClient, legacy_id: str, *, balance: int = 0, currency: str = "usd"
) -> str:
    customer = client.v1.customers.create(
        params={"email": "support@example.com", "metadata": {"legacy_account_id": legacy_id}}
    )
    if balance:
        client.v1.customers.balance_transactions.create(
            customer.id, params={"amount": balance, "currency": currency}
        )
    return str(customer.id)


def _run(home: Path, sim: ThreadedSimulator | None, batch_id: str, *args: str, **extra: object) -> Any:
    return job_cli(
        "run",
        "--job",
        "credit_migration",
        "--id",
        batch_id,
        "--size",
        str(SIZE),
        *args,
        env=_env(home, sim, **extra),
    )


def _status(home: Path, batch_id: str) -> dict[str, Any]:
    out = job_cli("status", "--id", batch_id, "--json", env=clean_env(home))
    assert out.returncode == 0, out.stderr
    return dict(json.loads(out.stdout))


def _sim_credits(sim: ThreadedSimulator) -> ProviderCredits:
    return ProviderCredits.of_store(Path(sim.server.store.path))


@pytest.mark.slow
@both_backends
def test_a_customer_made_by_hand_is_adopted_and_its_balance_planned_from(
    home: Path, sim: ThreadedSimulator
) -> None:
    acct, currency, credit = _accounts("cm1")[0]
    existing = _hand_made(_client(sim), acct, balance=-250, currency=currency)

    run = _run(home, sim, "cm1")

    assert run.returncode == 0, (run.stdout, run.stderr)
    credits = _sim_credits(sim)
    assert [c["id"] for c in credits.customers[acct]] == [existing]  # adopted, not duplicated
    assert_credits_exact(credits, expected_balances([("cm1", SIZE)]))
    moved = [int(t["amount"]) for t in credits.transactions[existing]]
    assert moved == [-250, -credit + 250] or sorted(moved) == sorted([-250, -credit + 250])
    assert migration_report(home, "cm1")[acct]["customer_id"] == existing
    status = _status(home, "cm1")
    assert status["provider"]["kind"] == "stripe" and status["provider"]["account"].startswith("acct_")
    assert status["provider"]["livemode"] is False
    assert f"provider: stripe account {status['provider']['account']} (test mode)" in run.stdout


@pytest.mark.slow
def test_an_account_with_two_customers_is_held_alone_until_a_person_keeps_one(
    home: Path, sim: ThreadedSimulator
) -> None:
    client = _client(sim)
    accounts = _accounts("cm1")
    acct = accounts[1][0]
    first, second = _hand_made(client, acct), _hand_made(client, acct)

    run = _run(home, sim, "cm1")

    assert run.returncode == 4, (run.stdout, run.stderr)
    assert "needs review: 1 item held for a person" in run.stdout
    note = migration_report(home, "cm1")[acct]
    assert (
        note["status"] == "held_for_review" and first in note["review_note"] and second in note["review_note"]
    )
    credits = _sim_credits(sim)
    others = {a: t for a, t in expected_balances([("cm1", SIZE)]).items() if a != acct}
    assert_credits_exact(
        ProviderCredits({a: credits.customers[a] for a in others}, credits.transactions), others
    )
    assert sorted(c["id"] for c in credits.customers[acct]) == sorted([first, second])
    assert all(c["balance"] == 0 for c in credits.customers[acct])  # no credit moved to either
    assert _status(home, "cm1")["held_for_review"] == 1

    again = _run(home, sim, "cm2")  # the next night holds it again, never fails the batch
    assert again.returncode == 4, (again.stdout, again.stderr)

    client.v1.customers.delete(second)  # a person keeps one
    kept = _run(home, sim, "cm3")
    assert kept.returncode == 0, (kept.stdout, kept.stderr)
    credits = _sim_credits(sim)
    assert [c["id"] for c in credits.customers[acct]] == [first]
    assert_credits_exact(credits, expected_balances([("cm1", SIZE), ("cm2", SIZE), ("cm3", SIZE)]))


@pytest.mark.slow
def test_a_customer_deleted_at_the_provider_is_held_never_recreated_and_its_replacement_adopted(
    home: Path, sim: ThreadedSimulator
) -> None:
    assert _run(home, sim, "cm1").returncode == 0
    acct = _accounts("cm1")[2][0]
    (deleted,) = _sim_credits(sim).customers[acct]
    _client(sim).v1.customers.delete(deleted["id"])

    run = _run(home, sim, "cm2")

    assert run.returncode == 4, (run.stdout, run.stderr)
    row = migration_report(home, "cm2")[acct]
    assert (
        row["status"] == "held_for_review"
        and "deleted" in row["review_note"]
        and deleted["id"] in row["review_note"]
    )
    assert acct not in _sim_credits(sim).customers  # not re-created
    assert sim.server.store.stats()["customers_created"] == len(_accounts("cm1"))

    # A person makes the replacement (Stripe has no undelete): the next night adopts it, says so,
    # and migrates the account's credit to it; every balance is exact.
    replacement = _hand_made(_client(sim), acct)
    adopted = _run(home, sim, "cm3")
    assert adopted.returncode == 0, (adopted.stdout, adopted.stderr)
    row = migration_report(home, "cm3")[acct]
    assert row["status"] != "held_for_review" and row["customer_id"] == replacement, row
    assert f"adopted customer {replacement}" in row["review_note"] and deleted["id"] in row["review_note"]
    assert_credits_exact(_sim_credits(sim), expected_balances([("cm1", SIZE), ("cm2", SIZE), ("cm3", SIZE)]))


@pytest.mark.slow
def test_near_matches_are_held_with_the_candidate_named_never_a_second_customer_beside_them(
    home: Path, sim: ThreadedSimulator
) -> None:
    """A customer whose legacy id differs only in case, one whose differs only in spaces, and one with
    the account's email under another account id: each account is held naming its candidate, and
    no customer is created for it; the rest migrates. Once a person removed the wrong ones, the
    next night creates their customers and is exact."""
    from durable_assets.credit_migration.synthetic import synthetic_accounts
    from durable_assets.credit_migration.validation import validate_accounts

    client = _client(sim)
    valid = validate_accounts(synthetic_accounts("cm1", SIZE)).valid
    (case, _, _), (spaced, _, _), (mailed, _, _) = _accounts("cm1")[3:6]
    email = str(valid.loc[valid["legacy_account_id"] == mailed, "email"].iloc[0])
    near = {
        case: client.v1.customers.create(params={"metadata": {"legacy_account_id": case.lower()}}).id,
        spaced: client.v1.customers.create(params={"metadata": {"legacy_account_id": f" {spaced} "}}).id,
        mailed: client.v1.customers.create(
            params={"email": email, "metadata": {"legacy_account_id": "OTHER-1"}}
        ).id,
    }

    run = _run(home, sim, "cm1")

    assert run.returncode == 4, (run.stdout, run.stderr)
    report = migration_report(home, "cm1")
    for acct, candidate in near.items():
        row = report[acct]
        assert row["status"] == "held_for_review" and candidate in row["review_note"], row
        assert "no second customer is created" in row["review_note"], row
    assert "the same but for case or spaces" in report[case]["review_note"]
    assert "has the account's email" in report[mailed]["review_note"]
    credits = _sim_credits(sim)
    assert not any(acct in credits.customers for acct in near)  # nothing created beside them
    others = {a: t for a, t in expected_balances([("cm1", SIZE)]).items() if a not in near}
    assert_credits_exact(
        ProviderCredits({a: credits.customers[a] for a in others}, credits.transactions), others
    )

    for candidate in near.values():  # a person decides they are not these accounts' customers
        client.v1.customers.delete(candidate)
    fixed = _run(home, sim, "cm2")
    assert fixed.returncode == 0, (fixed.stdout, fixed.stderr)
    assert_credits_exact(_sim_credits(sim), expected_balances([("cm1", SIZE), ("cm2", SIZE)]))


@pytest.mark.slow
def test_a_balance_changed_by_hand_between_nights_is_held_with_both_figures_never_reverted(
    home: Path, sim: ThreadedSimulator
) -> None:
    """+300 added by hand at the provider; the next night's export has not changed for the account.
    The account is held with both figures, its balance stays as the person left it, the rest of
    the night is exact; once the person sets it back, the night after is exact."""
    assert _run(home, sim, "cm1").returncode == 0
    second_night = {a: (c, cr) for a, c, cr in _accounts("cm2")}
    acct, currency, credit = next(
        (a, c, cr) for a, c, cr in _accounts("cm1") if cr > 0 and second_night.get(a) == (c, cr)
    )
    client = _client(sim)
    (customer,) = _sim_credits(sim).customers[acct]
    client.v1.customers.balance_transactions.create(
        customer["id"], params={"amount": 300, "currency": currency}
    )

    run = _run(home, sim, "cm2")

    assert run.returncode == 4, (run.stdout, run.stderr)
    row = migration_report(home, "cm2")[acct]
    assert row["status"] == "held_for_review", row
    note = row["review_note"]
    assert "changed at the provider outside this migration" in note and "has not changed" in note, note
    credits = _sim_credits(sim)
    assert (
        sum(int(t["amount"]) for t in credits.transactions[customer["id"]]) == -credit + 300
    )  # not reverted
    others = {a: t for a, t in expected_balances([("cm1", SIZE), ("cm2", SIZE)]).items() if a != acct}
    assert_credits_exact(
        ProviderCredits({a: credits.customers[a] for a in others}, credits.transactions), others
    )

    client.v1.customers.balance_transactions.create(
        customer["id"], params={"amount": -300, "currency": currency}
    )
    fixed = _run(home, sim, "cm3")
    assert fixed.returncode == 0, (fixed.stdout, fixed.stderr)
    assert_credits_exact(_sim_credits(sim), expected_balances([("cm1", SIZE), ("cm2", SIZE), ("cm3", SIZE)]))


@pytest.mark.slow
@both_backends
def test_one_instance_against_two_accounts_and_the_embedded_provider(
    home: Path, sim: ThreadedSimulator, tmp_path: Path
) -> None:
    with ThreadedSimulator(tmp_path / "sim-b.db", api_keys=[API_KEY]) as other:
        assert _run(home, sim, "on-a").returncode == 0
        on_b = _run(home, other, "on-b")  # the same legacy accounts, another account
        assert on_b.returncode == 0, (on_b.stdout, on_b.stderr)
        on_embedded = _run(home, None, "on-embedded")
        assert on_embedded.returncode == 0, (on_embedded.stdout, on_embedded.stderr)
        assert "(inside this instance: no real money moved)" in on_embedded.stdout

        assert_credits_exact(_sim_credits(sim), expected_balances([("on-a", SIZE)]))
        assert_credits_exact(_sim_credits(other), expected_balances([("on-b", SIZE)]))
        assert_credits_exact(
            ProviderCredits.of_store(home / "payments.db"), expected_balances([("on-embedded", SIZE)])
        )
        accounts = {_status(home, b)["provider"]["account"] for b in ("on-a", "on-b", "on-embedded")}
        assert len(accounts) == 3

        # A batch stopped at its ceiling on account A, then resumed against B: refused, naming both.
        stopped = _run(home, sim, "stopped", DURABLE_MAX_CREDIT_ADJUSTMENTS_PER_BATCH=0)
        assert stopped.returncode == 1, (stopped.stdout, stopped.stderr)
        wrong = job_cli("resume", "--id", "stopped", env=_env(home, other))
        assert wrong.returncode == 2, (wrong.stdout, wrong.stderr)
        a, b = _status(home, "on-a")["provider"]["account"], _status(home, "on-b")["provider"]["account"]
        (line,) = wrong.stderr.strip().splitlines()
        assert a in line and b in line and "DURABLE_PAYMENTS_URL" in line
        right = job_cli("resume", "--id", "stopped", "--override-guardrails", env=_env(home, sim))
        assert right.returncode == 0, (right.stdout, right.stderr)
        assert_credits_exact(_sim_credits(sim), expected_balances([("on-a", SIZE), ("stopped", SIZE)]))


@pytest.mark.slow
def test_a_refund_batch_resumed_against_another_account_is_refused(
    home: Path, sim: ThreadedSimulator, tmp_path: Path
) -> None:
    with ThreadedSimulator(tmp_path / "sim-b.db", api_keys=[API_KEY]) as other:
        stopped = job_cli(
            "run", "--id", "r1", "--size", "40", env=_env(home, sim, DURABLE_MAX_REFUNDS_PER_BATCH=1)
        )
        assert stopped.returncode == 1, (stopped.stdout, stopped.stderr)
        wrong = job_cli("resume", "--id", "r1", env=_env(home, other))
        assert wrong.returncode == 2 and "r1 was started against stripe account" in wrong.stderr, wrong.stderr
        assert other.server.store.stats()["refund_requests"] == 0
        right = job_cli("resume", "--id", "r1", "--override-guardrails", env=_env(home, sim))
        assert right.returncode in (0, 4), (right.stdout, right.stderr)
        assert sim.server.store.stats()["refunds_created"] == len(synthetic_candidates("r1", 40))
        assert other.server.store.stats()["refunds_created"] == 0


@pytest.mark.slow
@both_backends
def test_a_persons_decisions_settle_held_accounts_for_every_later_night(
    home: Path, sim: ThreadedSimulator
) -> None:
    """Two reviews only a person can settle (#34 item 2): an account whose email a customer of
    another account shares (a family account), and a balance a person credited by hand on purpose.
    Held on the night they appear; then `job decide` says "no customer" for the first and "keep the
    provider's balance" for the second, and every later night leaves both as decided (exit 0),
    with the decision in the report and in `job status`, and everything else exact."""
    from durable_assets.credit_migration.synthetic import synthetic_accounts
    from durable_assets.credit_migration.validation import validate_accounts

    client = _client(sim)
    valid = validate_accounts(synthetic_accounts("cm1", SIZE)).valid
    second_night = {a: (c, cr) for a, c, cr in _accounts("cm2")}
    third_night = {a: (c, cr) for a, c, cr in _accounts("cm3")}
    family = _accounts("cm1")[4][0]
    email = str(valid.loc[valid["legacy_account_id"] == family, "email"].iloc[0])
    client.v1.customers.create(params={"email": email, "metadata": {"legacy_account_id": "OTHER-9"}})
    assert _run(home, sim, "cm1").returncode == 4
    assert migration_report(home, "cm1")[family]["status"] == "held_for_review"

    credited, currency, credit = next(
        (a, c, cr)
        for a, c, cr in _accounts("cm1")
        if a != family and cr > 0 and second_night.get(a) == (c, cr) == third_night.get(a)
    )
    (customer,) = _sim_credits(sim).customers[credited]
    client.v1.customers.balance_transactions.create(
        customer["id"], params={"amount": -500, "currency": currency}
    )
    assert _run(home, sim, "cm2").returncode == 4
    assert migration_report(home, "cm2")[credited]["status"] == "held_for_review"

    env = _env(home, sim)
    for item, word, why in [
        (family, "no-customer", "shares the family's login; support closed it"),
        (credited, "keep-provider-balance", "goodwill credit, ticket 4711"),
    ]:
        decided = job_cli("decide", "--job", "credit_migration", "--item", item, word, "--note", why, env=env)
        assert decided.returncode == 0, decided.stderr

    run = _run(home, sim, "cm3")

    assert run.returncode == 0, (run.stdout, run.stderr)
    assert "decided by a person" in run.stdout, run.stdout
    report = migration_report(home, "cm3")
    assert report[family]["status"] == "decided_by_person", report[family]
    assert "shares the family's login" in report[family]["review_note"]
    assert report[credited]["status"] == "decided_by_person", report[credited]
    assert "goodwill credit, ticket 4711" in report[credited]["review_note"]
    credits = _sim_credits(sim)
    assert family not in credits.customers  # never a customer beside the sibling's
    assert sum(int(t["amount"]) for t in credits.transactions[customer["id"]]) == -credit - 500  # kept
    decided_items = {d["item"]: d["decision"] for d in _status(home, "cm3")["decisions"]}
    assert decided_items == {family: "no-customer", credited: "keep-provider-balance"}
    others = {
        a: t
        for a, t in expected_balances([("cm1", SIZE), ("cm2", SIZE), ("cm3", SIZE)]).items()
        if a not in (family, credited)
    }
    assert_credits_exact(
        ProviderCredits({a: credits.customers[a] for a in others}, credits.transactions), others
    )
