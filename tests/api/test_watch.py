"""Watching a real batch over HTTP: a `job serve` process and a `job run` process on one instance.

While the batch runs, the test polls ``GET /runs/{ID}``, reads one uninterrupted event stream, and
reads the same stream through a client that leaves and comes back twice with ``Last-Event-ID``.
The provider is rate-limited (client side) so the refund step spans several chunks and seconds,
and each step is delayed so the stream has silences for keepalives.
"""

from __future__ import annotations

import itertools
import json
import threading
from datetime import datetime
from pathlib import Path
from typing import Any

import httpx
import pytest

from durable_assets.payments.store import PaymentStore
from tests.api.helpers import Event, Stream, api_server, read_stream
from tests.crash.helpers import Expected, JobProcess, job, job_env
from tests.support.homes import make_home
from tests.support.polling import wait_until

BATCH = "watch-1"
SIZE = 1200  # 216 refunds: two chunks of the refund step
REFUND_STEP = 4


def _in_thread(fn: Any, *args: Any, **kwargs: Any) -> tuple[threading.Thread, dict[str, Any]]:
    box: dict[str, Any] = {}

    def run() -> None:
        try:
            box["value"] = fn(*args, **kwargs)
        except BaseException as exc:  # surfaced by the main thread
            box["error"] = exc

    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t, box


def _result(thread: threading.Thread, box: dict[str, Any], timeout: float = 240) -> Any:
    thread.join(timeout)
    assert not thread.is_alive(), "client thread still running"
    if "error" in box:
        raise box["error"]
    return box["value"]


def _reconnecting_reader(url: str, leave_after: list[int]) -> list[Stream]:
    """Leaves after each count of events in ``leave_after``, resuming from the last id it had."""
    parts: list[Stream] = []
    last: int | None = None
    for n in [*leave_after, None]:
        part = read_stream(url, last_event_id=last, stop_after=n)
        parts.append(part)
        if part.events:
            last = part.events[-1].id
        if part.ended:
            break
    return parts


def _poll_percent(base: str, stop: threading.Event) -> list[float]:
    seen: list[float] = []
    with httpx.Client(timeout=30) as client:
        while not stop.is_set():
            response = client.get(f"{base}/runs/{BATCH}")
            if response.status_code == 200:
                body = response.json()
                seen.append(body["percent_complete"])
                if body["status"] in ("succeeded", "failed", "canceled"):
                    return seen
            else:
                assert response.status_code == 404, response.text  # before the run exists
            stop.wait(0.1)
    return seen


def _wait_for_batch(base: str, batch: str, worker: JobProcess) -> None:
    """Until the API knows the batch (or its worker ended, which the caller's assertions report)."""
    wait_until(
        lambda: httpx.get(f"{base}/runs/{batch}", timeout=30).status_code == 200 or not worker.alive(),
        timeout=120,
        what=f"batch {batch} to exist",
    )


def _position(events: list[Event], step: int, status: str) -> int:
    return next(
        i
        for i, e in enumerate(events)
        if e.event == "step" and e.data["step"] == step and e.data["status"] == status
    )


@pytest.mark.slow
def test_watch_a_running_batch_over_http(tmp_path: Path) -> None:
    home = make_home(tmp_path)
    env = job_env(home, DURABLE_API_HEARTBEAT_S=0.5)
    with api_server(env, tmp_path) as server:
        base = server.url
        events_url = f"{base}/runs/{BATCH}/events"
        worker = JobProcess(
            ["run", "--id", BATCH, "--size", str(SIZE)],
            job_env(home, DURABLE_RATE_LIMIT=150, DURABLE_STEP_DELAY_S=0.7),
            tmp_path,
        )
        stop = threading.Event()
        poller, percents_box = _in_thread(_poll_percent, base, stop)
        _wait_for_batch(base, BATCH, worker)
        full_thread, full_box = _in_thread(read_stream, events_url)
        resumed_thread, resumed_box = _in_thread(_reconnecting_reader, events_url, [5, 20])

        assert worker.wait(300) == 0, worker.tail()
        percents: list[float] = _result(poller, percents_box)
        full: Stream = _result(full_thread, full_box)
        parts: list[Stream] = _result(resumed_thread, resumed_box)
        stop.set()

        # percent_complete rises monotonically to 100, through values in between.
        assert percents, "no status was read while the batch ran"
        assert all(a <= b for a, b in itertools.pairwise(percents)), percents
        assert percents[-1] == 100.0
        assert len({p for p in percents if 0 < p < 100}) >= 3, percents

        # One uninterrupted stream: increasing ids, ends with the terminal status, keepalives in silences.
        events = full.events
        assert full.ended and events
        ids = [e.id for e in events]
        assert ids == sorted(set(ids)), "ids must strictly increase"
        assert (events[-1].event, events[-1].data["status"]) == ("status", "succeeded")
        assert [e.data["status"] for e in events if e.event == "status"] == ["running", "succeeded"]
        assert full.keepalives >= 1
        steps = [(e.data["step"], e.data["status"]) for e in events if e.event == "step"]
        assert steps == [(n, s) for n in range(1, 8) for s in ("in_progress", "completed")]

        # Progress of the refund step arrives during the refund step, chunk by chunk.
        start = _position(events, REFUND_STEP, "in_progress")
        end = _position(events, REFUND_STEP, "completed")
        refund_progress = [e for e in events[start:end] if e.event == "progress"]
        n = Expected.of(BATCH, SIZE).n
        assert all(e.data["step"] == REFUND_STEP and e.data["total"] == 7 for e in refund_progress)
        assert any(0 < e.data["done"] < e.data["of"] == n for e in refund_progress), refund_progress
        assert (refund_progress[-1].data["done"], refund_progress[-1].data["of"]) == (n, n)
        finished = datetime.fromisoformat(events[end].data["timestamp"]).timestamp()
        assert any(e.received < finished for e in refund_progress), "progress only arrived after the step"

        # The client that left twice and came back has every event exactly once.
        assert [len(p.events) for p in parts[:2]] == [5, 20] and len(parts) == 3 and parts[-1].ended
        rejoined = [e for p in parts for e in p.events]
        assert [(e.id, e.event, e.data) for e in rejoined] == [(e.id, e.event, e.data) for e in events]

        # Coming back after the end: 204, which tells EventSource clients to stop reconnecting.
        assert read_stream(events_url, last_event_id=events[-1].id).status_code == 204

        # GET /runs/{ID} is exactly `job status --json`.
        status = json.loads(job(["status", "--id", BATCH, "--json"], env, tmp_path).stdout)
        assert httpx.get(f"{base}/runs/{BATCH}", timeout=30).json() == status


#: Per job: the provider's counters of its side effects (none may happen after the cancel).
SIDE_EFFECTS = {
    "refund_batch": ("refunds_created",),
    "credit_migration": ("customers_created", "balance_transactions_created"),
}


@pytest.mark.slow
@pytest.mark.parametrize("job_name", list(SIDE_EFFECTS))
def test_cancel_over_http_stops_the_batch_and_the_stream_ends_with_it(tmp_path: Path, job_name: str) -> None:
    home = make_home(tmp_path)
    env = job_env(home)
    with api_server(env, tmp_path) as server:
        base = server.url
        worker = JobProcess(
            ["run", "--job", job_name, "--id", "cancel-1", "--size", "100"],
            job_env(home, DURABLE_STEP_DELAY_S=1.0),
            tmp_path,
        )
        _wait_for_batch(base, "cancel-1", worker)
        stream_thread, stream_box = _in_thread(read_stream, f"{base}/runs/cancel-1/events")
        wait_until(
            lambda: (
                httpx.get(f"{base}/runs/cancel-1", timeout=30).json()["steps"][1]["status"] == "in_progress"
            ),
            timeout=120,
            what="step 2 to start",
        )
        response = httpx.post(f"{base}/runs/cancel-1/cancel", timeout=30)
        assert response.status_code == 202
        assert response.json() == {"id": "cancel-1", "result": "cancel requested"}
        assert httpx.get(f"{base}/runs/cancel-1", timeout=30).json()["status"] in ("canceling", "canceled")

        assert worker.wait(180) == 1, worker.tail()
        final = httpx.get(f"{base}/runs/cancel-1", timeout=30).json()
        assert final["status"] == "canceled" and final["job"] == job_name, final
        stream: Stream = _result(stream_thread, stream_box)
        statuses = [e.data["status"] for e in stream.events if e.event == "status"]
        assert statuses == ["running", "canceling", "canceled"] and stream.events[-1].event == "status"
        completed = {
            e.data["step"] for e in stream.events if e.event == "step" and e.data["status"] == "completed"
        }
        assert completed <= {1, 2}, completed
    # Counted by the provider, whose file outlives the worker: step 1's (refunds: the synthetic
    # batch's charges) happened before the cancel; nothing of the mutating steps after it.
    stats = PaymentStore(str(home / "payments.db")).stats()
    assert {name: stats[name] for name in SIDE_EFFECTS[job_name]} == dict.fromkeys(SIDE_EFFECTS[job_name], 0)
