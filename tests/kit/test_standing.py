"""The one-statement check before every side effect answers as the cancel and lease stores do."""

from __future__ import annotations

import signal

import pytest

from durable_assets.errors import BatchCanceledError, BatchInterruptedError, FencedOutError
from durable_assets.kit.cancel import CancelStore
from durable_assets.kit.db import DurableDatabase
from durable_assets.kit.leases import LeaseStore
from durable_assets.kit.standing import Standing, raise_unless_may_send, read_standing
from durable_assets.kit.step_leases import StepLeaseStore
from durable_assets.ops.interrupts import request_stop_of_run


def test_standing_reads_the_lease_and_the_cancel_request(durable_db_url: str) -> None:
    db = DurableDatabase(durable_db_url)
    assert read_standing(db, "b1") == Standing(canceled=False, stop_signal=None, run_id=None, fence=None)
    lease = LeaseStore(db, ttl_s=15).acquire("b1", "run-a")
    held = {"stop_signal": None, "run_id": "run-a", "fence": lease.fence}
    assert read_standing(db, "b1") == Standing(canceled=False, **held)
    CancelStore(db).request("b1")
    assert read_standing(db, "b1") == Standing(canceled=True, **held)
    assert read_standing(db, "b2").canceled is False  # another batch's request is not this one's


def test_the_holder_may_send_and_nobody_else(durable_db_url: str) -> None:
    db = DurableDatabase(durable_db_url)
    fence = LeaseStore(db, ttl_s=15).acquire("b1", "run-a").fence
    raise_unless_may_send(db, "b1", fence)
    raise_unless_may_send(db, "b1", fence, run_id="run-a")
    with pytest.raises(FencedOutError, match="fence 1; this worker held fence 2"):
        raise_unless_may_send(db, "b1", fence + 1)
    with pytest.raises(FencedOutError, match="is now run by run-a; this task of run run-b"):
        raise_unless_may_send(db, "b1", fence, run_id="run-b")
    with pytest.raises(FencedOutError, match=r"taken over by run \? \(no lease; this worker held fence 1\)"):
        raise_unless_may_send(db, "no-lease", 1)


def test_a_cancel_is_judged_before_the_fence(durable_db_url: str) -> None:
    """As the two stores did: a canceled batch says canceled (resume continues it), not fenced."""
    db = DurableDatabase(durable_db_url)
    LeaseStore(db, ttl_s=15).acquire("b1", "run-a")
    CancelStore(db).request("b1")
    with pytest.raises(BatchCanceledError, match="job resume --id b1"):
        raise_unless_may_send(db, "b1", fence=99)


def test_a_stop_request_stops_the_tasks_of_its_run_only(durable_db_url: str) -> None:
    """Ctrl-C of a distributed `job run` reaches its tasks; the resume's run is not stopped by it."""
    db = DurableDatabase(durable_db_url)
    fence = LeaseStore(db, ttl_s=15).acquire("b1", "run-a").fence
    request_stop_of_run(db, "b1", "run-a", signal.SIGINT)
    request_stop_of_run(db, "b1", "run-a", signal.SIGTERM)  # the first signal is the one reported
    assert read_standing(db, "b1", "run-a").stop_signal == signal.SIGINT
    assert read_standing(db, "b1", "run-b").stop_signal is None
    assert read_standing(db, "b2", "run-a").stop_signal is None
    with pytest.raises(BatchInterruptedError, match=r"interrupted \(SIGINT\).*job resume --id b1") as raised:
        raise_unless_may_send(db, "b1", fence, run_id="run-a")
    assert raised.value.signum == signal.SIGINT
    with pytest.raises(FencedOutError):  # another run's task: stopped by the lease, not this request
        raise_unless_may_send(db, "b1", fence, run_id="run-b")
    CancelStore(db).request("b1")
    with pytest.raises(BatchCanceledError):  # a cancel is still judged first
        raise_unless_may_send(db, "b1", fence, run_id="run-a")


def test_a_task_reads_who_holds_its_step_in_the_same_statement(durable_db_url: str) -> None:
    """A distributed task's check names its step: the step lease's owner comes back with the
    batch's standing (one statement per effect, not two), and only the current execution is it."""
    db = DurableDatabase(durable_db_url)
    LeaseStore(db, ttl_s=15).acquire("b1", "run-a")
    steps = StepLeaseStore(db, ttl_s=15)
    assert read_standing(db, "b1", "run-a", "refunds__shard_0_of_4").step_owner is None
    assert steps.acquire("run-a", "refunds__shard_0_of_4", "b1", attempt=1, owner="exec-1")
    assert read_standing(db, "b1", "run-a", "refunds__shard_0_of_4").step_owner == "exec-1"
    assert steps.acquire("run-a", "refunds__shard_0_of_4", "b1", attempt=2, owner="exec-2")
    assert read_standing(db, "b1", "run-a", "refunds__shard_0_of_4").step_owner == "exec-2"
    assert read_standing(db, "b1", "run-a", "refunds__shard_1_of_4").step_owner is None
    assert read_standing(db, "b1", "run-b", "refunds__shard_0_of_4").step_owner is None
    assert read_standing(db, "b1").step_owner is None  # no step named: a run in process
