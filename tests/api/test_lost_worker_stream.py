"""Issue #34, part 5: the event stream of a batch whose worker died ends, and stays ended.

A real `job run` is SIGKILLed before its first step while a real `job serve` watches its instance.
Dagster keeps the dead run started, so the stream ends on the synthetic `failed` event `job status`
derives. Before the fix every reconnect with that event's id got a new `failed` event with a higher
id (Chromium: 6 in 30 s, never closed); now its id is the last of the dead run's range, the same on
every poll of every server, and a reconnect with it is answered 204, which closes an EventSource.
(tests/ui/test_event_stream_browser.py drives the same thing from Chromium.)
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from durable_assets.ops.runlog import RUN_STRIDE
from tests.api.helpers import TOKEN, ApiServer, lose_worker, read_stream
from tests.crash.helpers import EXIT_OK, job, job_env
from tests.support.homes import make_home

pytestmark = pytest.mark.slow

BATCH = "lost-1"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
EXIT_NEEDS_REVIEW = 4


@dataclass
class Lost:
    root: Path
    env: dict[str, str]
    server: ApiServer
    run_id: str

    @property
    def events_url(self) -> str:
        return f"{self.server.url}/runs/{BATCH}/events"


@pytest.fixture(scope="module")
def lost(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Lost]:
    root = tmp_path_factory.mktemp("lost")
    env = job_env(make_home(root), DURABLE_API_TOKEN=TOKEN, lease_ttl_s=60.0)
    server = ApiServer(env, root)
    try:
        run_id = lose_worker(server.url, env, root, BATCH, AUTH)
        yield Lost(root, env, server, run_id)
    finally:
        server.close()


def test_a_lost_worker_s_terminal_event_has_one_id_and_a_reconnect_after_it_is_204(lost: Lost) -> None:
    first = read_stream(lost.events_url, headers=AUTH, timeout=60)
    assert first.status_code == 200 and first.ended
    end = first.events[-1]
    assert end.event == "status" and end.data["status"] == "failed", end
    assert "was lost" in end.data["error"] and f"`job resume --id {BATCH}`" in end.data["error"], end
    assert end.data["run_id"] == lost.run_id
    ids = [e.id for e in first.events]
    assert ids == sorted(set(ids)), "ids increase, none repeats"
    assert [e.data["status"] for e in first.events if e.event == "status"][-1:] == ["failed"]
    # Derived from what it describes: the last id of the first run's range, whoever computes it.
    assert end.id == RUN_STRIDE - 1

    # A second reader from the start gets the same events with the same ids.
    again = read_stream(lost.events_url, headers=AUTH, timeout=60)
    assert [e.id for e in again.events] == ids

    # What an EventSource does after the stream ends: reconnect with the last id. 204 every time
    # (before: a new `failed` event with a higher id, each time).
    for _ in range(5):
        assert read_stream(lost.events_url, headers=AUTH, last_event_id=end.id, timeout=30).status_code == 204
    assert read_stream(lost.events_url, headers=AUTH, last_event_id=end.id + 7, timeout=30).status_code == 204
    # A client that left just before the end gets the end once, with the same id.
    before = read_stream(
        lost.events_url, headers=AUTH, last_event_id=ids[-2] if len(ids) > 1 else 0, timeout=60
    )
    assert before.ended and [(e.id, e.data.get("status")) for e in before.events][-1:] == [(end.id, "failed")]

    # `job resume` starts a new run whose ids are all above the end: a client that had the end
    # continues with the new run's events and the stream ends on its `succeeded`.
    resumed = job(["resume", "--id", BATCH], {**lost.env}, lost.root, timeout=240)
    assert resumed.proc.returncode in (EXIT_OK, EXIT_NEEDS_REVIEW), resumed.tail()
    after = read_stream(lost.events_url, headers=AUTH, last_event_id=end.id, timeout=60)
    assert after.status_code == 200 and after.ended, after
    assert after.events and all(e.id > end.id for e in after.events)
    assert all(e.data["run_id"] != lost.run_id for e in after.events)
    assert after.events[-1].event == "status" and after.events[-1].data["status"] == "succeeded"
    assert (
        read_stream(lost.events_url, headers=AUTH, last_event_id=after.events[-1].id, timeout=30).status_code
        == 204
    )
