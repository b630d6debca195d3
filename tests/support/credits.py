"""What synthetic credit-migration batches must leave at the provider, and the check that they did.

The expectation is recomputed from the pure generator and validation, in the checking process,
independently of anything the worker stored. The provider is read from outside the worker (the
embedded provider's file, or the simulator's own store), so a killed worker cannot lie about it.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

#: The credit migration's steps as users see them in status, in order (written out, not read from
#: the job's descriptor, so a step renamed or reordered by accident fails the tests).
CREDIT_STEPS = (
    "legacy_accounts",
    "validated_accounts",
    "provider_customers",
    "planned_adjustments",
    "applied_adjustments",
    "verified_balances",
    "migration_report",
)


@dataclass(frozen=True)
class Target:
    currency: str
    balance_cents: int  # Stripe's sign: minus the credit


def expected_balances(batches: Iterable[tuple[str, int]]) -> dict[str, Target]:
    """The target of every account the synthetic batches ``(batch_id, size)`` migrate, run in
    order: an account takes the credit of the last batch in which its row was valid."""
    from durable_assets.credit_migration.synthetic import synthetic_accounts
    from durable_assets.credit_migration.validation import validate_accounts

    targets: dict[str, Target] = {}
    for batch_id, size in batches:
        valid = validate_accounts(synthetic_accounts(batch_id, size)).valid
        for acct, currency, credit in zip(
            valid["legacy_account_id"], valid["currency"], valid["credit_cents"], strict=True
        ):
            targets[str(acct)] = Target(str(currency), -int(credit))
    return targets


@dataclass(frozen=True)
class ProviderCredits:
    """The provider's customers (by legacy account) and every balance transaction of each."""

    customers: dict[str, list[dict[str, Any]]]  # legacy_account_id -> customers naming it
    transactions: dict[str, list[dict[str, Any]]]  # customer id -> its balance transactions

    @classmethod
    def of_store(cls, path: Path) -> ProviderCredits:
        """Read a provider's SQLite file (the embedded provider, or a simulator's ``--db``)."""
        from durable_assets.payments.store import PaymentStore

        with PaymentStore(str(path)) as store:
            listed = _all_pages(lambda after: store.list_customers(limit=100, starting_after=after))
            transactions = {
                c["id"]: _all_pages(
                    lambda after, cid=c["id"]: store.list_balance_transactions(
                        cid, limit=100, starting_after=after
                    )
                )
                for c in listed
            }
        by_account: dict[str, list[dict[str, Any]]] = {}
        for customer in listed:
            legacy = customer["metadata"].get("legacy_account_id")
            if legacy:
                by_account.setdefault(legacy, []).append(customer)
        return cls(by_account, transactions)


def _all_pages(page: Any) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    after: str | None = None
    while True:
        body: Mapping[str, Any] = page(after)
        data = list(body["data"])
        out += data
        if not body["has_more"] or not data:
            return out
        after = data[-1]["id"]


def assert_credits_exact(provider: ProviderCredits, expected: Mapping[str, Target]) -> None:
    """0 duplicate customers, 0 adjustments applied twice, every balance exact.

    For every expected account: exactly one provider customer names it; its balance is the target,
    in the account's currency; its balance transactions sum to that balance and none repeats an
    idempotency key. No customer names an account that was never valid.
    """
    twice = {acct: [c["id"] for c in cs] for acct, cs in provider.customers.items() if len(cs) > 1}
    assert not twice, f"accounts with more than one customer: {dict(list(twice.items())[:5])}"
    missing = sorted(set(expected) - set(provider.customers))
    unexpected = sorted(set(provider.customers) - set(expected))
    assert not missing and not unexpected, f"missing {missing[:5]}, unexpected {unexpected[:5]}"
    wrong: list[str] = []
    for acct, target in expected.items():
        (customer,) = provider.customers[acct]
        transactions = provider.transactions[customer["id"]]
        keys = Counter(t["metadata"].get("idempotency_key") for t in transactions)
        repeated = [k for k, n in keys.items() if k and n > 1]  # a hand-made transaction has no key
        assert not repeated, f"{acct}: idempotency keys applied twice: {repeated}"
        total = sum(int(t["amount"]) for t in transactions)
        if customer["balance"] != target.balance_cents or total != target.balance_cents:
            wrong.append(f"{acct}: balance {customer['balance']} (sum {total}), want {target.balance_cents}")
        elif transactions and customer["currency"] != target.currency:
            wrong.append(f"{acct}: currency {customer['currency']}, want {target.currency}")
    assert not wrong, f"{len(wrong)} balances wrong, e.g. {wrong[:5]}"


def migration_report(home: Path, batch_id: str) -> dict[str, dict[str, str]]:
    """The batch's migration report by legacy account id, wherever its instance keeps it: a SQLite
    home in its folder, a Postgres home in its database (``DURABLE_STORAGE=auto``)."""
    import csv
    import io

    from tests.crash.helpers import stored_output

    local = home / "batches" / batch_id / "migration_report.csv"
    data = stored_output(
        home, str(local) if local.is_file() else f"durable://batches/{batch_id}/migration_report.csv"
    )
    assert data, f"no migration report for {batch_id}"
    return {row["legacy_account_id"]: row for row in csv.DictReader(io.StringIO(data.decode()))}
