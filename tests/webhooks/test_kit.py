"""The webhook kit: signatures against the spec, the outbox's idempotence and claims, retries."""

from __future__ import annotations

import base64
import json
import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime

import pytest
import standardwebhooks

from durable_assets.errors import WebhookConfigError, WebhookVerificationError
from durable_assets.kit.db import DurableDatabase
from durable_assets.ops.webhooks.outbox import (
    DELIVERED,
    FAILED,
    PENDING,
    Deliverer,
    Outbox,
    WebhookSettings,
    decode_secret,
    message_id,
    parse_retry_after,
    sign,
    verify,
)
from tests.support.network import free_port

from .receiver import Receiver


def _settings(secret: str, *urls: str, **kw: float) -> WebhookSettings:
    base = {"timeout_s": 2.0, "backoff_base_s": 0.05, "backoff_cap_s": 5.0, "max_attempts": 5}
    base.update(kw)
    return WebhookSettings(
        urls=urls,
        key=decode_secret(secret),
        timeout_s=base["timeout_s"],
        backoff_base_s=base["backoff_base_s"],
        backoff_cap_s=base["backoff_cap_s"],
        max_attempts=int(base["max_attempts"]),
    )


def _enqueue(outbox: Outbox, *urls: str, batch: str = "b1", event: str = "batch.succeeded") -> str:
    wid = message_id(batch, "run-1", event)
    body = json.dumps({"type": event, "timestamp": "2026-01-01T00:00:00Z", "data": {"id": batch}})
    outbox.enqueue(batch_id=batch, run_id="run-1", event_type=event, webhook_id=wid, body=body, urls=urls)
    return wid


# --- signing ---------------------------------------------------------------------------------------


def test_signature_matches_the_reference_implementation(secret: str) -> None:
    body = b'{"type":"batch.succeeded","data":{"id":"x"}}'
    ts = int(time.time())
    ours = sign(decode_secret(secret), "msg_1", ts, body)
    reference = standardwebhooks.Webhook(secret).sign(
        "msg_1", datetime.fromtimestamp(ts, tz=UTC), body.decode()
    )
    assert ours == reference
    headers = {"webhook-id": "msg_1", "webhook-timestamp": str(ts), "webhook-signature": ours}
    assert verify(secret, headers, body) == json.loads(body)
    assert standardwebhooks.Webhook(secret).verify(body, headers) == json.loads(body)


def test_verify_rejects_forgeries_replays_and_missing_headers(secret: str) -> None:
    body = b'{"type":"batch.failed"}'
    ts = int(time.time())
    good = {"webhook-id": "msg_1", "webhook-timestamp": str(ts), "webhook-signature": ""}
    good["webhook-signature"] = sign(decode_secret(secret), "msg_1", ts, body)
    other = "whsec_" + base64.b64encode(b"another-secret-of-32-bytes-----").decode()
    cases = {
        "tampered body": (secret, good, b'{"type":"batch.succeeded"}'),
        "wrong secret": (other, good, body),
        "other id": (secret, {**good, "webhook-id": "msg_2"}, body),
        "no signature": (secret, {k: v for k, v in good.items() if k != "webhook-signature"}, body),
        "replayed": (secret, {**good, "webhook-timestamp": str(ts - 301)}, body),
    }
    for name, (s, headers, b) in cases.items():
        with pytest.raises(WebhookVerificationError):
            verify(s, headers, b)
            pytest.fail(name)
    # Several signatures (key rotation): any matching v1 is enough.
    rotated = {**good, "webhook-signature": "v1,AAAA " + good["webhook-signature"]}
    assert verify(secret, rotated, body)["type"] == "batch.failed"


def test_settings_from_env_fail_plainly() -> None:
    assert WebhookSettings.from_env({}) is None
    with pytest.raises(WebhookConfigError, match="DURABLE_WEBHOOK_SECRET"):
        WebhookSettings.from_env({"DURABLE_WEBHOOK_URLS": "http://127.0.0.1:1/h"})
    with pytest.raises(WebhookConfigError, match="base64"):
        WebhookSettings.from_env(
            {"DURABLE_WEBHOOK_URLS": "http://x/h", "DURABLE_WEBHOOK_SECRET": "whsec_%%%"}
        )
    with pytest.raises(WebhookConfigError, match="http"):
        WebhookSettings.from_env(
            {"DURABLE_WEBHOOK_URLS": "ftp://x", "DURABLE_WEBHOOK_SECRET": "whsec_" + "A" * 44}
        )
    s = WebhookSettings.from_env(
        {
            "DURABLE_WEBHOOK_URLS": " http://a/h, https://b/h ,http://a/h",
            "DURABLE_WEBHOOK_SECRET": "whsec_" + "A" * 44,
        }
    )
    assert s is not None and s.urls == ("http://a/h", "https://b/h")


def test_retry_after_parsing() -> None:
    assert parse_retry_after("3") == 3.0
    assert parse_retry_after(None) is None and parse_retry_after("soon") is None
    in_ten = datetime.fromtimestamp(time.time() + 10, tz=UTC).strftime("%a, %d %b %Y %H:%M:%S GMT")
    assert 8 <= (parse_retry_after(in_ten) or 0) <= 11


# --- outbox and delivery, on both backends ---------------------------------------------------------


def test_enqueue_is_idempotent(durable_db_url: str) -> None:
    outbox = Outbox(DurableDatabase(durable_db_url))
    wid = _enqueue(outbox, "http://a/h", "http://b/h")
    assert _enqueue(outbox, "http://a/h", "http://b/h") == wid
    rows = outbox.rows(batch_id="b1")
    assert sorted(r.url for r in rows) == ["http://a/h", "http://b/h"]
    assert {r.webhook_id for r in rows} == {wid} and {r.state for r in rows} == {PENDING}


def test_retries_500_then_429_with_retry_after_then_delivers_once(
    durable_db_url: str, secret: str, receiver: Callable[..., Receiver]
) -> None:
    r = receiver(script={"/hook": [(500, {}), (429, {"Retry-After": "1"})]})
    outbox = Outbox(DurableDatabase(durable_db_url))
    wid = _enqueue(outbox, r.url())
    report = Deliverer(outbox, _settings(secret, r.url())).flush(budget_s=20)
    seen = r.on("/hook")
    assert [x.answered for x in seen] == [500, 429, 200]
    assert {x.webhook_id for x in seen} == {wid}, "every retry carries the same webhook-id"
    assert seen[2].at - seen[1].at >= 1.0, "Retry-After: 1 was not honoured"
    assert list(r.deliveries()) == [wid] and not r.rejected()
    assert len(report.delivered) == 1 and report.attempts == 3 and not report.pending
    (row,) = outbox.rows()
    assert row.state == DELIVERED and row.attempts == 3 and row.last_status == 200


def test_410_stops_and_other_4xx_give_up_with_the_reason(
    durable_db_url: str, secret: str, receiver: Callable[..., Receiver]
) -> None:
    r = receiver(script={"/gone": [(410, {})] * 5, "/bad": [(400, {})] * 5})
    outbox = Outbox(DurableDatabase(durable_db_url))
    _enqueue(outbox, r.url("/gone"), r.url("/bad"))
    report = Deliverer(outbox, _settings(secret, r.url("/gone"), r.url("/bad"))).flush(budget_s=5)
    assert len(r.on("/gone")) == 1 and len(r.on("/bad")) == 1, "no retry after 410 or 400"
    rows = {row.url: row for row in outbox.rows()}
    assert rows[r.url("/gone")].state == FAILED and "410" in (rows[r.url("/gone")].last_error or "")
    assert rows[r.url("/bad")].state == FAILED and "HTTP 400" in (rows[r.url("/bad")].last_error or "")
    assert len(report.failed) == 2 and not report.pending


def test_gives_up_after_max_attempts(
    durable_db_url: str, secret: str, receiver: Callable[..., Receiver]
) -> None:
    r = receiver(default=503)
    outbox = Outbox(DurableDatabase(durable_db_url))
    _enqueue(outbox, r.url())
    Deliverer(outbox, _settings(secret, r.url(), max_attempts=3, backoff_base_s=0.01)).flush(budget_s=10)
    (row,) = outbox.rows()
    assert (
        len(r.on("/hook")) == 3
        and row.state == FAILED
        and "gave up after 3 attempts" in (row.last_error or "")
    )


def test_a_dead_receiver_costs_at_most_the_budget_and_stays_pending(
    durable_db_url: str, secret: str, receiver: Callable[..., Receiver]
) -> None:
    dead = f"http://127.0.0.1:{free_port()}/hook"  # a port nobody listens on: connection refused
    outbox = Outbox(DurableDatabase(durable_db_url))
    wid = _enqueue(outbox, dead)
    started = time.monotonic()
    # Full jitter can draw four short backoffs in a row, so with the default 5 attempts the row
    # could be given up (FAILED) inside the budget; this test is about the budget, not giving up.
    settings = _settings(secret, dead, backoff_base_s=0.2, max_attempts=1000)
    report = Deliverer(outbox, settings).flush(budget_s=1.0)
    assert time.monotonic() - started < 3.0
    assert [p.webhook_id for p in report.pending] == [wid] and report.attempts >= 1
    (row,) = outbox.rows()
    assert row.state == PENDING and "connection failed" in (row.last_error or "")


def test_two_deliverers_never_send_one_row_twice(
    durable_db_url: str, secret: str, receiver: Callable[..., Receiver]
) -> None:
    r = receiver()
    db = DurableDatabase(durable_db_url)
    outbox = Outbox(db)
    ids = {_enqueue(outbox, r.url(), batch=f"b{i}") for i in range(20)}
    settings = _settings(secret, r.url())
    barrier = threading.Barrier(4)

    def flush() -> None:
        barrier.wait()
        Deliverer(Outbox(db), settings, concurrency=4).flush(budget_s=10)

    threads = [threading.Thread(target=flush) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    seen = [x.webhook_id for x in r.on("/hook")]
    assert sorted(seen) == sorted(ids), "each row POSTed exactly once across four concurrent deliverers"
    assert {row.state for row in outbox.rows()} == {DELIVERED}


def test_a_row_whose_event_is_no_longer_true_is_not_sent(
    durable_db_url: str, secret: str, receiver: Callable[..., Receiver]
) -> None:
    r = receiver()
    outbox = Outbox(DurableDatabase(durable_db_url))
    _enqueue(outbox, r.url())
    report = Deliverer(outbox, _settings(secret, r.url()), check=lambda row: "run is now canceled").flush()
    assert not r.requests and len(report.failed) == 1
    assert "not sent: run is now canceled" in (outbox.rows()[0].last_error or "")
