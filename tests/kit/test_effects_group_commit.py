"""The effects runner's group commit, on both backends: answers are recorded by time (a window) and
by count, while other requests of the same chunk are still in flight; results and review share one
transaction; an error that stops the step still records every answer that arrived first."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import sqlalchemy as sa

from durable_assets.kit.db import DurableDatabase
from durable_assets.kit.effects import EffectRunner
from durable_assets.kit.ledger import FINISHED, REVIEW, STARTED, Intent, Ledger
from tests.support.machine import scaled
from tests.support.polling import wait_until

SCOPE = "refund"


@pytest.fixture
def ledger(durable_db_url: str) -> Iterator[Ledger]:
    db = DurableDatabase(durable_db_url)
    yield Ledger(db)
    db.engine.dispose()


def _first_run(ledger: Ledger, **options: Any) -> EffectRunner:
    """The runner of run-a, the batch's first run, with the grouping under test in ``options``."""
    return EffectRunner(ledger=ledger, scope=SCOPE, owner="run-a", **options)


def _points(ledger: Ledger) -> dict[str, str]:
    return {e.key: e.recovery_point for e in ledger.entries(SCOPE)}


def _intents(n: int) -> list[Intent]:
    return [Intent(f"k{i}", {"amount": i}) for i in range(n)]


def _answer(intent: Intent) -> dict[str, Any]:
    return {"id": f"re_{intent.key}", "amount": intent.params["amount"]}


def _blocking_last(ledger: Ledger, last: str, recorded: set[str]) -> Callable[[Intent], dict[str, Any]]:
    """``perform`` whose answer for ``last`` waits until every key of ``recorded`` is in the ledger as
    finished: the run can only end if the runner records them while ``last`` is still in flight."""

    def perform(intent: Intent) -> dict[str, Any]:
        if intent.key == last:
            wait_until(
                lambda: all(_points(ledger).get(k) == FINISHED for k in recorded),
                timeout=20,
                interval=0.01,
                what=f"{sorted(recorded)} recorded while {last} is in flight",
                detail=lambda: str(_points(ledger)),
            )
        return _answer(intent)

    return perform


def test_a_window_flush_records_answers_while_the_chunk_is_still_in_flight(ledger: Ledger) -> None:
    intents = _intents(10)
    others = {i.key for i in intents} - {"k5"}
    runner = _first_run(
        ledger,
        perform=_blocking_last(ledger, "k5", others),
        concurrency=2,
        commit_window_s=0.05,
        commit_max_keys=10_000,  # the count never triggers: only the window can
    )
    report = runner.run(intents)
    assert set(report.results) == {i.key for i in intents} and report.sent == 10
    assert set(_points(ledger).values()) == {FINISHED}
    assert runner.commits >= 2  # the others' commit(s), then k5's


def test_a_count_flush_records_every_max_keys_answers(ledger: Ledger) -> None:
    intents = _intents(7)
    runner = _first_run(
        ledger,
        perform=_blocking_last(ledger, "k6", {f"k{i}" for i in range(6)}),
        concurrency=1,  # one at a time, in order: k0..k5 answered before k6 is sent
        commit_window_s=3600.0,  # the window never triggers: only the count can
        commit_max_keys=3,
    )
    report = runner.run(intents)
    assert len(report.results) == 7
    # k0..k5 by count (one commit per 3, or one for all 6 when the flusher woke after k5 arrived),
    # then k6 when the run closes
    assert 2 <= runner.commits <= 3


def test_an_error_stops_the_step_but_every_answer_before_it_is_recorded(ledger: Ledger) -> None:
    intents = _intents(6)

    def perform(intent: Intent) -> dict[str, Any]:
        if intent.key == "k3":
            raise RuntimeError("the provider client broke")
        return _answer(intent)

    runner = _first_run(
        ledger,
        perform=perform,
        concurrency=1,
        commit_window_s=3600.0,
        commit_max_keys=10_000,  # nothing is due before the error: the close must record it all
    )
    with pytest.raises(RuntimeError, match="client broke"):
        runner.run(intents)
    points = _points(ledger)
    assert points.pop("k3") == STARTED  # never answered: stays an intent, re-sent with its key later
    assert points == dict.fromkeys(["k0", "k1", "k2", "k4", "k5"], FINISHED)
    # and a second attempt sends only k3
    sent: list[str] = []

    def again(intent: Intent) -> dict[str, Any]:
        sent.append(intent.key)
        return _answer(intent)

    report = EffectRunner(ledger=ledger, scope=SCOPE, owner="run-b", perform=again, fence=1).run(intents)
    assert sent == ["k3"] and len(report.results) == 6 and report.replayed == 5


def test_results_and_review_commit_in_one_transaction(ledger: Ledger, durable_db_url: str) -> None:
    ledger.claim(SCOPE, _intents(3), owner="run-a")
    commits = 0

    def count(_conn: Any) -> None:
        nonlocal commits
        commits += 1

    sa.event.listen(ledger.db.engine, "commit", count)
    try:
        ledger.record(SCOPE, finished={"k0": {"id": "re_0"}, "k1": {"id": "re_1"}}, review={"k2": {"m": 1}})
    finally:
        sa.event.remove(ledger.db.engine, "commit", count)
    assert commits == 1
    assert _points(ledger) == {"k0": FINISHED, "k1": FINISHED, "k2": REVIEW}
    (k2,) = ledger.entries(SCOPE, ["k2"])
    assert k2.result == {"m": 1}


def test_a_mismatched_answer_goes_to_review_through_the_same_commit(ledger: Ledger) -> None:
    intents = _intents(4)
    runner = _first_run(
        ledger,
        perform=_answer,
        verify=lambda i, _r: "amount differs" if i.key == "k2" else None,
        concurrency=4,
        commit_window_s=3600.0,
        commit_max_keys=4,
    )
    report = runner.run(intents)
    assert set(report.results) == {"k0", "k1", "k3"} and set(report.review) == {"k2"}
    assert runner.commits == 1
    assert _points(ledger)["k2"] == REVIEW


def test_answers_arriving_together_from_many_threads_are_all_recorded(ledger: Ledger) -> None:
    """No lost results: 500 answers from 16 threads, flushed by window and count at once."""
    intents = _intents(500)
    barrier = threading.Barrier(16)

    def perform(intent: Intent) -> dict[str, Any]:
        if int(intent.key[1:]) < 16:
            barrier.wait(timeout=scaled(20))  # the first 16 answer at the same instant
        return _answer(intent)

    runner = _first_run(
        ledger,
        perform=perform,
        concurrency=16,
        commit_window_s=0.005,
        commit_max_keys=7,
    )
    report = runner.run(intents)
    assert len(report.results) == 500 and report.sent == 500
    assert set(_points(ledger).values()) == {FINISHED} and len(_points(ledger)) == 500
