"""Keys per provider account (issue #20): the same key at two accounts is two effects, as at Stripe,
and a batch stays bound to the account it started with."""

from __future__ import annotations

import pytest

from durable_assets.errors import ProviderAccountMismatchError, UsageError
from durable_assets.kit.account_bindings import AccountBindings
from durable_assets.kit.accounts import ProviderAccount
from durable_assets.kit.db import DurableDatabase
from durable_assets.kit.ledger import Intent, Ledger

A = ProviderAccount("stripe", "acct_A")
B = ProviderAccount("stripe", "acct_B")


def test_one_account_in_two_modes_is_two_namespaces() -> None:
    live = ProviderAccount("stripe", "acct_A", livemode=True)
    assert len({A.namespace, live.namespace, B.namespace}) == 3
    assert A.describe() == "stripe account acct_A (test mode)"
    assert live.as_json() == {"kind": "stripe", "account": "acct_A", "livemode": True}
    with pytest.raises(ValueError):
        ProviderAccount("stripe", "")


def test_a_key_settled_at_one_account_is_unsettled_at_another(durable_db_url: str) -> None:
    ledger = Ledger(DurableDatabase(durable_db_url))
    at_a, at_b = ledger.for_account(A.namespace), ledger.for_account(B.namespace)
    refund = Intent("refund-inv-1", {"amount": 500}, subject="ch_1|duplicate")
    at_a.claim("refund", [refund], owner="run-a")
    at_a.record_results("refund", {refund.key: {"id": "re_at_a"}})

    claim = at_b.claim("refund", [refund], owner="run-b")

    assert [e.key for e in claim.owned] == [refund.key] and not claim.finished and not claim.taken
    assert at_a.claim("refund", [refund], owner="run-c").finished == {refund.key: {"id": "re_at_a"}}
    # Other parameters under the same key are still refused within one account, not across two.
    at_b.claim("refund", [Intent("refund-inv-1", {"amount": 500}, subject="ch_1|duplicate")], owner="run-b")
    assert {e.params["amount"] for e in ledger.for_account(B.namespace).entries("refund")} == {500}


def test_a_batch_stays_bound_to_its_first_account(durable_db_url: str) -> None:
    bindings = AccountBindings(DurableDatabase(durable_db_url))
    assert bindings.get("b1") is None
    assert bindings.bind("b1", A) == A
    assert bindings.bind("b1", A) == A  # every later run of the batch
    with pytest.raises(ProviderAccountMismatchError) as refused:
        bindings.bind("b1", B)
    assert isinstance(refused.value, UsageError)  # exit 2 at the CLI
    assert "acct_A" in str(refused.value) and "acct_B" in str(refused.value)
    assert bindings.get("b1") == A
    assert bindings.bind("b2", B) == B
