"""A real `job serve` process on a free port, and a small Server-Sent Events client."""

from __future__ import annotations

import contextlib
import json
import re
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from tests.crash.helpers import JobProcess
from tests.support.machine import scaled
from tests.support.polling import wait_until

TOKEN = "test-token-Zq9"


class ApiServer:
    """`job serve --port 0`; the address comes from the line it prints once it listens."""

    def __init__(self, env: Mapping[str, str], log_dir: Path, args: Sequence[str] = ()) -> None:
        self.proc = JobProcess(["serve", "--port", "0", *args], env, log_dir)
        found = wait_until(
            lambda: (
                re.search(r"listening on (http://\S+)", self.proc.stdout) or self.proc.proc.poll() is not None
            ),
            timeout=120,
            what="`job serve` to listen",
        )
        if not isinstance(found, re.Match):
            raise AssertionError(f"`job serve` exited\n{self.proc.tail()}")
        self.url: str = found.group(1)

    def close(self) -> None:
        self.proc.terminate(timeout=15)  # SIGTERM, 15 s (scaled) to go, then SIGKILL; the group reaped


@contextlib.contextmanager
def api_server(env: Mapping[str, str], log_dir: Path) -> Iterator[ApiServer]:
    server = ApiServer(env, log_dir)
    try:
        yield server
    finally:
        server.close()


@dataclass
class Event:
    id: int
    event: str
    data: dict[str, Any]
    received: float = field(compare=False)  # time.time() when it arrived


@dataclass
class Stream:
    status_code: int
    events: list[Event]
    keepalives: int
    ended: bool  # the server closed the stream (as opposed to the client leaving)


def read_stream(
    url: str,
    *,
    headers: Mapping[str, str] | None = None,
    last_event_id: int | None = None,
    stop_after: int | None = None,
    timeout: float = 180,
) -> Stream:
    """Read an SSE stream until the server ends it, or leave after ``stop_after`` events."""
    hdrs = dict(headers or {})
    if last_event_id is not None:
        hdrs["Last-Event-ID"] = str(last_event_id)
    events: list[Event] = []
    keepalives = 0
    fields: dict[str, str] = {}
    deadline = time.monotonic() + scaled(timeout)
    with httpx.stream("GET", url, headers=hdrs, timeout=httpx.Timeout(scaled(30.0))) as response:
        if response.status_code != 200:
            response.read()
            return Stream(response.status_code, [], 0, True)
        assert response.headers["content-type"].startswith("text/event-stream"), response.headers
        for line in response.iter_lines():
            assert time.monotonic() < deadline, f"stream still open after {scaled(timeout):.0f} s"
            if line.startswith(":"):
                keepalives += line.strip() == ": keepalive"
            elif line == "":
                if "data" in fields:
                    events.append(
                        Event(int(fields["id"]), fields["event"], json.loads(fields["data"]), time.time())
                    )
                    if stop_after is not None and len(events) >= stop_after:
                        return Stream(200, events, keepalives, False)
                fields = {}
            else:
                name, _, value = line.partition(":")
                fields[name] = value[1:] if value.startswith(" ") else value
    return Stream(200, events, keepalives, True)


def lose_worker(
    url: str, env: Mapping[str, str], log_dir: Path, batch_id: str, headers: Mapping[str, str]
) -> str:
    """Start `job run --id batch_id` parked before its first step, SIGKILL it once the API shows the
    step running, and return the dead run's id: a batch whose worker died, which Dagster still
    calls started (only the lease and the gone process say it is dead)."""
    worker = JobProcess(
        ["run", "--id", batch_id, "--size", "20"], {**env, "DURABLE_STEP_DELAY_S": "600"}, log_dir
    )
    try:

        def first_step_running() -> dict[str, Any] | None:
            assert worker.alive(), worker.tail()
            response = httpx.get(f"{url}/runs/{batch_id}", headers=headers, timeout=30)
            if response.status_code != 200:
                return None
            body: dict[str, Any] = response.json()
            return body if body["steps"][0]["status"] == "in_progress" else None

        status = wait_until(first_step_running, timeout=120, what=f"batch {batch_id} to start its first step")
        worker.sigkill()
    finally:
        worker.reap_group()
    return str(status["run_ids"][-1])
