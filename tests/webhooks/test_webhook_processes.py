"""Slow tier: webhooks from real `job` processes, including one SIGKILLed between send and record.

The receiver runs in a thread of the test process, so it outlives every worker and counts what
really arrived; the outbox is read from the instance's database afterwards.
"""

from __future__ import annotations

import signal
from collections.abc import Callable
from pathlib import Path

import pytest

from durable_assets.kit.crashpoints import CrashPoint
from durable_assets.kit.db import DurableDatabase
from durable_assets.ops import runner
from durable_assets.ops.webhooks.outbox import DELIVERED, PENDING, Outbox
from tests.support.homes import make_home
from tests.support.polling import wait_until

from ..crash.helpers import EXIT_FAILED, EXIT_OK, JobProcess, instance_reader, job, job_env
from .receiver import Receiver

pytestmark = pytest.mark.slow


def _env(home: Path, secret: str, *urls: str, **extra: object) -> dict[str, str]:
    return job_env(
        home,
        DURABLE_WEBHOOK_URLS=",".join(urls),
        DURABLE_WEBHOOK_SECRET=secret,
        DURABLE_WEBHOOK_TIMEOUT_S=1,  # so a dead deliverer's claim lapses after 3 s
        DURABLE_WEBHOOK_BACKOFF_BASE_S=0.05,
        **extra,
    )


def _outbox_rows(home: Path, batch_id: str) -> list:  # type: ignore[type-arg]
    with instance_reader(home) as reader:
        return Outbox(DurableDatabase.for_instance(reader.instance)).rows(batch_id=batch_id)


def test_killed_between_send_and_record_resends_the_same_id(
    tmp_path: Path, secret: str, receiver: Callable[..., Receiver]
) -> None:
    home, batch = make_home(tmp_path), "wh-kill"
    r = receiver()
    env = _env(home, secret, r.url())
    kill_after_send = {**env, "DURABLE_CRASH_AT": f"{CrashPoint.WEBHOOK_SENT}:1"}
    killed = job(["run", "--id", batch, "--size", "20"], kill_after_send, tmp_path)
    assert killed.proc.returncode == -signal.SIGKILL, killed.tail()
    (first,) = r.on("/hook")
    assert first.answered == 200 and first.payload and first.payload["type"] == "batch.succeeded"
    (row,) = _outbox_rows(home, batch)
    assert row.state == PENDING and row.attempts == 0 and row.claimed_by, "the record must not have committed"

    # The next flush: `job resume` of the succeeded batch waits out the dead claim and re-sends.
    again = job(["resume", "--id", batch], env, tmp_path)
    assert again.proc.returncode == EXIT_OK and "already succeeded" in again.stdout, again.tail()
    seen = r.on("/hook")
    assert len(seen) == 2 and {s.webhook_id for s in seen} == {first.webhook_id}, "re-sent with the SAME id"
    assert seen[1].payload == first.payload
    assert len(r.deliveries()) == 1 and not r.rejected(), "the receiver sees one logical delivery"
    (row,) = _outbox_rows(home, batch)
    assert row.state == DELIVERED and row.attempts == 1


def test_cancel_then_resume_sends_canceled_then_succeeded_once_each(
    tmp_path: Path, secret: str, receiver: Callable[..., Receiver]
) -> None:
    home, batch = make_home(tmp_path), "wh-cancel"
    r = receiver()
    env = _env(home, secret, r.url("/a"), r.url("/b"), DURABLE_STEP_DELAY_S=0.5)
    worker = JobProcess(["run", "--id", batch, "--size", "20"], env, tmp_path)
    with instance_reader(home) as reader:
        wait_until(lambda: (reader.status(batch) or {}).get("status") == "running", 120, what="a running run")
        # What `job cancel` does, from here: a cold CLI start could lose the race with a short batch.
        assert runner.cancel_batch(reader.instance, batch) == "cancel requested"
        assert worker.wait(120) == EXIT_FAILED, worker.tail()
        assert (reader.status(batch) or {}).get("status") == "canceled"
    resumed = job(["resume", "--id", batch], env, tmp_path)
    assert resumed.proc.returncode == EXIT_OK, resumed.tail()
    for path in ("/a", "/b"):
        got = r.deliveries(path)
        assert [p["type"] for p in got.values()] == ["batch.canceled", "batch.succeeded"], got
        assert len(r.on(path)) == 2
    assert not r.rejected()
