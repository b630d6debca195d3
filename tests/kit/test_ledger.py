"""The idempotency ledger on both backends: atomic phases, mismatch, claims under concurrency."""

from __future__ import annotations

import multiprocessing as mp
from typing import Any

import pytest

from durable_assets.errors import IdempotencyKeyMismatchError
from durable_assets.kit.db import DurableDatabase
from durable_assets.kit.ledger import FINISHED, Intent, Ledger
from tests.support.machine import scaled


def _ledger(url: str, ttl: float = 60.0) -> Ledger:
    return Ledger(DurableDatabase(url), claim_ttl_s=ttl)


def test_intent_then_result_then_replay(durable_db_url: str) -> None:
    ledger = _ledger(durable_db_url)
    intents = [Intent(f"k{i}", {"amount": i}) for i in range(3)]
    claim = ledger.claim("refund", intents, owner="run-a")
    assert [e.key for e in claim.owned] == ["k0", "k1", "k2"]
    ledger.record_results("refund", {"k0": {"id": "re_0"}})
    again = ledger.claim("refund", intents, owner="run-b")
    assert again.finished == {"k0": {"id": "re_0"}}
    # k1, k2 are still claimed by run-a (live claim, same fence): run-b must not own them.
    assert sorted(again.held_elsewhere) == ["k1", "k2"]
    assert [e.recovery_point for e in ledger.entries("refund", ["k0"])] == [FINISHED]


def test_same_key_other_params_is_an_error_and_changes_nothing(durable_db_url: str) -> None:
    ledger = _ledger(durable_db_url)
    ledger.claim("refund", [Intent("k", {"amount": 100})], owner="a")
    with pytest.raises(IdempotencyKeyMismatchError, match="other parameters"):
        ledger.claim("refund", [Intent("k", {"amount": 200}), Intent("new", {"amount": 1})], owner="a")
    assert [e.params for e in ledger.entries("refund")] == [{"amount": 100}]  # 'new' rolled back too


def test_newer_fence_takes_over_claims_of_a_superseded_worker(durable_db_url: str) -> None:
    ledger = _ledger(durable_db_url)
    ledger.claim("refund", [Intent("k", {"a": 1})], owner="old", fence=1)
    claim = ledger.claim("refund", [Intent("k", {"a": 1})], owner="new", fence=2)
    assert [e.key for e in claim.owned] == ["k"]
    assert ledger.claim("refund", [Intent("k", {"a": 1})], owner="old", fence=1).held_elsewhere == ["k"]


def test_expired_claims_are_taken_over(durable_db_url: str) -> None:
    ledger = _ledger(durable_db_url, ttl=-1.0)  # every claim is born expired
    ledger.claim("refund", [Intent("k", {"a": 1})], owner="a")
    assert [e.key for e in ledger.claim("refund", [Intent("k", {"a": 1})], owner="b").owned] == ["k"]


def test_review_is_one_way(durable_db_url: str) -> None:
    ledger = _ledger(durable_db_url)
    ledger.claim("refund", [Intent("k", {"a": 1})], owner="a")
    ledger.record_review("refund", {"k": {"mismatch": "amount"}})
    ledger.record_results("refund", {"k": {"id": "re"}})  # must not reopen a review row
    claim = ledger.claim("refund", [Intent("k", {"a": 1})], owner="a")
    assert claim.review == {"k": {"mismatch": "amount"}} and not claim.owned


def _claim_all(url: str, owner: str, keys: int, out: mp.Queue) -> None:  # type: ignore[type-arg]
    ledger = _ledger(url)
    owned = ledger.claim("refund", [Intent(f"k{i}", {"i": i}) for i in range(keys)], owner=owner).owned
    out.put((owner, [e.key for e in owned]))


def test_two_processes_never_both_own_a_key(durable_db_url: str) -> None:
    ctx = mp.get_context("spawn")
    queue: mp.Queue = ctx.Queue()  # type: ignore[type-arg]
    procs = [ctx.Process(target=_claim_all, args=(durable_db_url, f"w{n}", 200, queue)) for n in range(4)]
    for p in procs:
        p.start()
    results = [queue.get(timeout=scaled(60)) for _ in procs]
    for p in procs:
        p.join(timeout=scaled(60))
    owned = [k for _owner, keys in results for k in keys]
    assert len(owned) == len(set(owned)) == 200


def test_a_subject_is_claimed_by_the_first_key_for_good(durable_db_url: str) -> None:
    """Issue #14.3: keys per invoice, money per charge — a second key on one charge is never sent."""
    ledger = _ledger(durable_db_url)
    first = ledger.claim(
        "refund",
        [
            Intent("k-b", {"invoice_id": "B"}, subject="charge:ch_1:overcharge"),
            Intent("k-a", {"invoice_id": "A"}, subject="charge:ch_1:overcharge"),
            Intent("k-c", {"invoice_id": "C"}, subject="charge:ch_1:duplicate_charge"),
        ],
        owner="batch-1",
    )
    # Within one call the smallest key wins, whatever order the rows came in.
    assert sorted(e.key for e in first.owned) == ["k-a", "k-c"]
    assert set(first.taken) == {"k-b"} and first.taken["k-b"].holder_key == "k-a"
    assert first.taken["k-b"].holder_params == {"invoice_id": "A"}
    assert [e.key for e in ledger.entries("refund", ["k-b"])] == []  # never even an intent

    # A later batch naming the charge through another invoice: taken, not sent.
    later = ledger.claim(
        "refund", [Intent("k-z", {"invoice_id": "Z"}, subject="charge:ch_1:overcharge")], owner="b2"
    )
    assert later.owned == [] and later.taken["k-z"].holder_key == "k-a"
    # The holder itself is unaffected (a resume of batch 1 re-claims its own key).
    again = ledger.claim(
        "refund", [Intent("k-a", {"invoice_id": "A"}, subject="charge:ch_1:overcharge")], owner="batch-1"
    )
    assert [e.key for e in again.owned] == ["k-a"] and again.taken == {}


def _claim_subject(url: str, key: str, barrier: Any, out: Any) -> None:
    ledger = _ledger(url)
    barrier.wait()
    claim = ledger.claim("refund", [Intent(key, {"k": key}, subject="charge:ch_9:overcharge")], owner=key)
    out.put((key, [e.key for e in claim.owned]))


def test_concurrent_workers_never_both_own_one_subject(durable_db_url: str) -> None:
    ctx = mp.get_context("spawn")
    barrier, out = ctx.Barrier(4), ctx.Queue()
    procs = [
        ctx.Process(target=_claim_subject, args=(durable_db_url, f"k{i}", barrier, out)) for i in range(4)
    ]
    for p in procs:
        p.start()
    owned = [out.get(timeout=scaled(60)) for _ in procs]
    for p in procs:
        p.join(timeout=scaled(60))
    assert sum(len(keys) for _key, keys in owned) == 1, owned


@pytest.mark.postgres
def test_a_chunks_rows_reach_postgres_in_one_round_trip_not_one_each(
    pg_database: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """psycopg2's own executemany sends one statement per round trip (200 for a chunk's intents,
    before its first request); the engine sends them as psycopg2's batches, with the same effect."""
    import psycopg2.extras

    batches: list[int] = []
    execute_batch = psycopg2.extras.execute_batch

    def counted(cursor: Any, sql: str, rows: Any, page_size: int = 100) -> None:
        batches.append(len(rows))
        execute_batch(cursor, sql, rows, page_size=page_size)

    monkeypatch.setattr(psycopg2.extras, "execute_batch", counted)
    ledger = _ledger(pg_database)
    intents = [Intent(f"k{i}", {"amount": i}) for i in range(200)]
    assert len(ledger.claim("refund", intents, owner="run-a").owned) == 200
    ledger.record_results("refund", {f"k{i}": {"id": f"re_{i}"} for i in range(200)})
    assert batches.count(200) >= 2  # the intents, then the results, each one executemany
    again = ledger.claim("refund", intents, owner="run-b")
    assert again.finished == {f"k{i}": {"id": f"re_{i}"} for i in range(200)}
