"""A person's decision for an item: kept per provider account, replaced by a newer word, withdrawn."""

from __future__ import annotations

from durable_assets.kit.db import DurableDatabase
from durable_assets.kit.decisions import ItemDecisions, all_decisions


def test_a_decision_is_kept_per_account_and_the_newest_word_is_in_force(durable_db_url: str) -> None:
    db = DurableDatabase(durable_db_url)
    first, second = ItemDecisions(db, "stripe:acct_1:test"), ItemDecisions(db, "stripe:acct_2:test")
    first.record("credit_migration", "ACC-1", "no-customer", "closed in 2019", "ann@host")
    first.record("credit_migration", "ACC-1", "keep-provider-balance", "goodwill credit", "bob@host")
    first.record("other_job", "ACC-1", "skip", "another job's item", "ann@host")

    in_force = first.of_job("credit_migration")
    assert list(in_force) == ["ACC-1"]
    assert in_force["ACC-1"].decision == "keep-provider-balance"
    assert in_force["ACC-1"].decided_by == "bob@host"
    assert "bob@host decided keep-provider-balance on " in in_force["ACC-1"].describe()
    assert in_force["ACC-1"].describe().endswith(": goodwill credit")
    # The same account id at another provider account is another account: nothing decided there.
    assert second.of_job("credit_migration") == {}
    assert {(d.job, d.item) for d in all_decisions(db)} == {
        ("credit_migration", "ACC-1"),
        ("other_job", "ACC-1"),
    }
    assert [d.job for d in all_decisions(db, "other_job")] == ["other_job"]


def test_withdrawing_returns_what_was_in_force_once(durable_db_url: str) -> None:
    decisions = ItemDecisions(DurableDatabase(durable_db_url), "embedded:acct_x:test")
    decisions.record("credit_migration", "ACC-2", "no-customer", "test account", "ann@host")

    gone = decisions.withdraw("credit_migration", "ACC-2")
    assert gone is not None and gone.decision == "no-customer" and gone.note == "test account"
    assert decisions.withdraw("credit_migration", "ACC-2") is None
    assert decisions.of_job("credit_migration") == {}
