"""Terminal-status webhooks of real batches (runner.start_batch / resume_batch / cancel_batch in
this process, on a temporary instance), received and verified by a local receiver."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
from dagster import DagsterInstance, DagsterRunStatus, build_run_status_sensor_context, build_sensor_context

from durable_assets.definitions import defs, refund_batch_job
from durable_assets.errors import WebhookConfigError
from durable_assets.kit.db import DurableDatabase, now
from durable_assets.kit.leases import LeaseStore
from durable_assets.kit.tags import BATCH_TAG
from durable_assets.ops import runner
from durable_assets.ops.status import batch_status
from durable_assets.ops.webhooks import batch as batch_webhooks
from durable_assets.ops.webhooks.outbox import DELIVERED, FAILED, Outbox
from tests.support.polling import wait_until

from .receiver import Receiver

SIZE = 20


@pytest.fixture
def hooks(monkeypatch: pytest.MonkeyPatch, secret: str) -> Callable[..., None]:
    def configure(*urls: str) -> None:
        monkeypatch.setenv("DURABLE_WEBHOOK_URLS", ",".join(urls))
        monkeypatch.setenv("DURABLE_WEBHOOK_SECRET", secret)
        monkeypatch.setenv("DURABLE_WEBHOOK_BACKOFF_BASE_S", "0.05")
        monkeypatch.setenv("DURABLE_WEBHOOK_TIMEOUT_S", "2")

    return configure


def _bad_invoices(tmp_path: Path) -> str:
    path = tmp_path / "broken.csv"
    path.write_text("invoice_id,amount\n1,2\n")  # lacks the required columns: step 1 fails
    return str(path)


def test_succeeded_batch_two_urls_one_flaky_each_gets_exactly_one(
    dagster_home: Path, receiver: Callable[..., Receiver], hooks: Callable[..., None]
) -> None:
    r = receiver(script={"/a": [(500, {}), (429, {"Retry-After": "1"})]})
    hooks(r.url("/a"), r.url("/b"))
    with DagsterInstance.get() as instance:
        run = runner.start_batch(instance, "wh-ok", size=SIZE)
        assert run.status == DagsterRunStatus.SUCCESS
        final = batch_status(instance, "wh-ok").as_json()
        # A repeated flush (e.g. `job resume` of the succeeded batch) sends nothing new.
        assert runner.resume_batch(instance, "wh-ok") is None
    assert [x.answered for x in r.on("/a")] == [500, 429, 200]
    assert [x.answered for x in r.on("/b")] == [200]
    assert not r.rejected(), r.rejected()
    a, b = r.deliveries("/a"), r.deliveries("/b")
    assert len(a) == 1 and a == b, "one logical delivery per URL, the same message id on both"
    (payload,) = a.values()
    assert payload["type"] == "batch.succeeded" and payload["timestamp"].endswith("Z")
    assert payload["data"] == final and payload["data"]["status"] == "succeeded"
    assert len({x.webhook_id for x in r.on("/a")}) == 1, "retries reuse the webhook-id"


def test_failed_then_each_terminal_state_once(
    dagster_home: Path, tmp_path: Path, receiver: Callable[..., Receiver], hooks: Callable[..., None]
) -> None:
    r = receiver()
    hooks(r.url())
    with DagsterInstance.get() as instance:
        run = runner.start_batch(instance, "wh-fail", input_path=_bad_invoices(tmp_path), size=SIZE)
        assert run.status == DagsterRunStatus.FAILURE
        # The resume fails the same way: a second, distinct batch.failed (another run's end).
        again = runner.resume_batch(instance, "wh-fail")
        assert again is not None and again.status == DagsterRunStatus.FAILURE
    got = r.deliveries()
    assert [p["type"] for p in got.values()] == ["batch.failed", "batch.failed"]
    assert [p["data"]["run_ids"] for p in got.values()] == [[run.run_id], [run.run_id, again.run_id]]
    assert len(r.on("/hook")) == 2


def test_cancel_of_a_run_not_started_sends_batch_canceled(
    dagster_home: Path, receiver: Callable[..., Receiver], hooks: Callable[..., None]
) -> None:
    r = receiver()
    hooks(r.url())
    with DagsterInstance.get() as instance:
        instance.add_dynamic_partitions("batches", ["wh-q"])
        instance.create_run_for_job(
            refund_batch_job(),
            run_config={"ops": {"invoices": {"config": {"size": SIZE}}}},
            tags={BATCH_TAG: "wh-q", "dagster/partition": "wh-q"},
            status=DagsterRunStatus.NOT_STARTED,  # launched from the UI, not picked up yet
        )
        assert runner.cancel_batch(instance, "wh-q") == "cancel requested"
    (payload,) = r.deliveries().values()
    assert payload["type"] == "batch.canceled" and payload["data"]["status"] == "canceled"


def test_which_ends_are_events(dagster_home: Path, tmp_path: Path, hooks: Callable[..., None]) -> None:
    """Superseded runs and a failure taken over by a live resume are not the batch's end."""
    with DagsterInstance.get() as instance:
        first = runner.start_batch(instance, "wh-rules", input_path=_bad_invoices(tmp_path), size=SIZE)
        event, why = batch_webhooks.terminal_event(instance, first.run_id)
        assert event is not None and event.event_type == "batch.failed", why
        leases = LeaseStore(DurableDatabase.for_instance(instance))
        lease = leases.acquire("wh-rules", run_id="pending", owner="another-host:1")
        event, why = batch_webhooks.terminal_event(instance, first.run_id)
        assert event is None and "taken over" in why
        leases.release(lease)
        second = runner.resume_batch(instance, "wh-rules")
        assert second is not None
        event, why = batch_webhooks.terminal_event(instance, first.run_id)
        assert event is None and "superseded" in why
        assert batch_webhooks.terminal_event(instance, second.run_id)[0] is not None


def test_sensor_enqueues_and_delivers_once(
    dagster_home: Path,
    receiver: Callable[..., Receiver],
    hooks: Callable[..., None],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The daemon path, evaluated directly: a run the CLI did not notify is sent by the sensor, once."""
    r = receiver()
    with DagsterInstance.get() as instance:
        run = runner.start_batch(instance, "wh-sensor", size=SIZE)  # webhooks not configured yet
        hooks(r.url())
        sensor = next(s for s in defs.sensors if s.name == "batch_succeeded_webhooks")
        for _ in range(2):  # the same event evaluated twice (two sensors, a restarted daemon)
            sensor(  # type: ignore[operator]
                build_run_status_sensor_context(
                    sensor_name=sensor.name,
                    dagster_event=instance.all_logs(run.run_id)[-1].dagster_event,
                    dagster_instance=instance,
                    dagster_run=run,
                )
            )
    assert len(r.deliveries()) == 1 and len(r.on("/hook")) == 1


def test_outbox_sensor_retries_what_the_cli_left_pending(
    dagster_home: Path,
    receiver: Callable[..., Receiver],
    hooks: Callable[..., None],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    r = receiver(script={"/hook": [(503, {"Retry-After": "0"})]})
    hooks(r.url())
    monkeypatch.setenv("DURABLE_WEBHOOK_CLI_BUDGET_S", "0")  # one attempt, then leave it pending
    with DagsterInstance.get() as instance:
        runner.start_batch(instance, "wh-later", size=SIZE)
        assert [x.answered for x in r.on("/hook")] == [503]
        store = Outbox(DurableDatabase.for_instance(instance))
        wait_until(lambda: store.rows()[0].due_at() <= now(), timeout=5, what="the retry's backoff")
        # The daemon's next tick of the outbox sensor:
        sensor = next(s for s in defs.sensors if s.name == "webhook_outbox")
        sensor(build_sensor_context(instance=instance))  # type: ignore[operator]
        (row,) = store.rows(batch_id="wh-later")
    assert [x.answered for x in r.on("/hook")] == [503, 200] and row.state == DELIVERED
    assert len(r.deliveries()) == 1


def test_410_is_recorded_and_not_retried_by_a_later_flush(
    dagster_home: Path, receiver: Callable[..., Receiver], hooks: Callable[..., None]
) -> None:
    r = receiver(default=410)
    hooks(r.url())
    with DagsterInstance.get() as instance:
        runner.start_batch(instance, "wh-gone", size=SIZE)
        assert runner.resume_batch(instance, "wh-gone") is None  # a later flush of the batch
        (row,) = Outbox(DurableDatabase.for_instance(instance)).rows(batch_id="wh-gone")
    assert len(r.on("/hook")) == 1 and row.state == FAILED and "410" in (row.last_error or "")


def test_a_broken_configuration_fails_before_the_run(
    dagster_home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("DURABLE_WEBHOOK_URLS", "http://127.0.0.1:9/h")
    monkeypatch.delenv("DURABLE_WEBHOOK_SECRET", raising=False)
    with DagsterInstance.get() as instance, pytest.raises(WebhookConfigError) as err:
        runner.start_batch(instance, "wh-conf", size=SIZE)
    assert err.value.exit_code == 2
    with DagsterInstance.get() as instance:
        assert not instance.get_runs()
