"""Issue #34, part 5, in a real browser: Chromium's EventSource on the stream of a batch whose worker died.

Before the fix the stream ended on a synthetic `failed` event, the EventSource reconnected with its
id as `Last-Event-ID` (what the HTML standard makes it do), and each reconnect got a new `failed`
with a higher id: Chromium received 6 in 30 s and never closed. Now the reconnect is answered 204
and the EventSource closes for good, having had the terminal event once.

Debian's Chromium (tests/support/browser.py, never a downloaded browser) opens the API's own
`/healthz` so that the page is same-origin with the stream (no CORS needed), and runs an
EventSource there with the token in the query, as docs/api.md tells browsers to.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest

from durable_assets.ops.runlog import RUN_STRIDE
from tests.api.helpers import TOKEN, ApiServer, lose_worker
from tests.crash.helpers import job_env
from tests.support.browser import chromium_binary, headless_chromium
from tests.support.homes import make_home
from tests.support.machine import scaled

pytestmark = pytest.mark.slow

BATCH = "lost-ui"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
#: The stream's history, its end (a lost-worker check every 2 s), Chromium's reconnect delay
#: (about 3 s) and the 204, on a loaded machine.
#: Scaled by the machine's measured slowness, like every deadline of the suite.
CLOSED_WITHIN_S = 60.0

WATCH = """([url]) => {
  window.watch = {events: [], opens: 0, errors: 0, closed: false};
  const source = new EventSource(url);
  source.onopen = () => { window.watch.opens += 1; };
  for (const kind of ["progress", "step", "status"]) {
    source.addEventListener(kind, e => {
      window.watch.events.push({id: e.lastEventId, event: kind, data: JSON.parse(e.data)});
    });
  }
  source.onerror = () => {
    window.watch.errors += 1;
    // The stream's end reads as an error with CONNECTING (the EventSource reconnects); the 204
    // answering that reconnect reads as an error with CLOSED, and nothing reconnects after it.
    if (source.readyState === EventSource.CLOSED) { window.watch.closed = true; }
  };
  window.source = source;
}"""


@dataclass
class Lost:
    server: ApiServer
    run_id: str


@pytest.fixture(scope="module")
def lost(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Lost]:
    chromium_binary()  # before anything starts: apt may still be installing it
    root = tmp_path_factory.mktemp("lost-ui")
    env = job_env(make_home(root), DURABLE_API_TOKEN=TOKEN, lease_ttl_s=60.0)
    server = ApiServer(env, root)
    try:
        yield Lost(server, lose_worker(server.url, env, root, BATCH, AUTH))
    finally:
        server.close()


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    with headless_chromium() as b:
        yield b


def _stream_requests(log: str) -> list[int]:
    """The statuses uvicorn's access log shows for the batch's event stream, in order."""
    return [int(m) for m in re.findall(rf'"GET /runs/{BATCH}/events HTTP/1.1" (\d{{3}})', log)]


def test_chromium_gets_a_lost_worker_s_end_once_and_its_eventsource_closes(lost: Lost, browser: Any) -> None:
    page = browser.new_page()
    try:
        page.goto(f"{lost.server.url}/healthz")  # the API's origin: the stream is same-origin
        page.evaluate(WATCH, [f"{lost.server.url}/runs/{BATCH}/events?access_token={TOKEN}"])
        page.wait_for_function("() => window.watch.closed", timeout=scaled(CLOSED_WITHIN_S) * 1000)
        watch = json.loads(json.dumps(page.evaluate("() => window.watch")))
        state = page.evaluate("() => window.source.readyState")
    finally:
        page.close()

    assert state == 2, "EventSource.CLOSED"
    events = watch["events"]
    ends = [e for e in events if e["event"] == "status" and e["data"]["status"] == "failed"]
    assert len(ends) == 1, f"the terminal event arrived {len(ends)} times: {ends}"
    end = ends[0]
    assert events[-1] == end and int(end["id"]) == RUN_STRIDE - 1, events[-3:]
    assert end["data"]["run_id"] == lost.run_id and "was lost" in end["data"]["error"], end
    ids = [int(e["id"]) for e in events]
    assert ids == sorted(set(ids)), "an event arrived twice or out of order"
    # One stream opened; the reconnect after its end was refused with 204, which closed it.
    assert watch["opens"] == 1 and watch["errors"] == 2, watch
    statuses = _stream_requests(lost.server.proc.stderr + lost.server.proc.stdout)
    assert statuses == [200, 204], statuses
    print(f"\nChromium: {len(events)} events, the end (id {end['id']}) once, then 204 and CLOSED")
