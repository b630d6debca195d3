"""Slow tier: the daemon path. A batch launched as the UI launches it (no CLI anywhere) is announced
by the run-status sensors of a real `dagster dev`, once per URL, verified by the receiver."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
from dagster._core.definitions.run_request import InstigatorType

from tests.support.dagster_dev import DagsterDev
from tests.support.homes import make_home
from tests.support.polling import wait_until

from ..crash.helpers import instance_reader, job_env
from .receiver import Receiver

pytestmark = pytest.mark.slow


def test_daemon_sensors_deliver_a_ui_launched_batch_once_per_url(
    tmp_path: Path, secret: str, receiver: Callable[..., Receiver]
) -> None:
    home, batch = make_home(tmp_path), "wh-daemon"
    r = receiver(script={"/a": [(503, {})]})  # the sensor's pass fails once; the outbox sensor retries
    env = job_env(
        home,
        DURABLE_WEBHOOK_URLS=f"{r.url('/a')},{r.url('/b')}",
        DURABLE_WEBHOOK_SECRET=secret,
        DURABLE_WEBHOOK_BACKOFF_BASE_S=0.05,
    )
    dev = DagsterDev(home, env, tmp_path)
    try:
        with instance_reader(home) as reader:
            dev.start()
            instance = reader.instance

            def sensor_initialised() -> bool:
                # A run-status sensor's first tick sets its cursor to "now": launch after it.
                states = instance.all_instigator_state(instigator_type=InstigatorType.SENSOR)
                return any(
                    s.name == "batch_succeeded_webhooks" and getattr(s.instigator_data, "cursor", None)
                    for s in states
                )

            wait_until(sensor_initialised, timeout=120, interval=0.5, what="the sensor's first tick")
            instance.add_dynamic_partitions("batches", [batch])
            dev.launch(batch, 20)
            wait_until(lambda: r.deliveries("/a") and r.deliveries("/b"), 240, 0.25, what="both deliveries")
            status = reader.status(batch)
    finally:
        dev.stop()
    assert status is not None and status["status"] == "succeeded"
    for path in ("/a", "/b"):
        (payload,) = r.deliveries(path).values()
        assert payload["type"] == "batch.succeeded" and payload["data"]["id"] == batch
    assert [x.answered for x in r.on("/a")] == [503, 200] and [x.answered for x in r.on("/b")] == [200]
    assert r.deliveries("/a").keys() == r.deliveries("/b").keys() and not r.rejected()
