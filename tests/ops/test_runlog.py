"""LineageFeed: ids across a lineage, the one-poll settle, paging and the end of a lineage.

A fake event log stands in for Dagster's here, because the case that matters most — a record that
commits after a higher id is already visible (Postgres allocates ids before commit) — cannot be
produced on demand with a real storage.
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from durable_assets.ops.runlog import RUN_STRIDE, LineageFeed, decode_id, encode_id


class FakeLog:
    def __init__(self) -> None:
        self.records: dict[str, list[int]] = {}

    def add(self, run_id: str, *storage_ids: int) -> None:
        self.records.setdefault(run_id, []).extend(storage_ids)

    def get_records_for_run(
        self, run_id: str, cursor: str | None = None, of_type: Any = None, limit: int | None = None
    ) -> Any:
        from dagster._core.event_api import EventLogCursor

        after = EventLogCursor.parse(cursor).storage_id() if cursor else 0
        ids = sorted(i for i in self.records.get(run_id, []) if i > after)
        page = ids[:limit] if limit else ids
        return SimpleNamespace(
            records=[SimpleNamespace(storage_id=i) for i in page], has_more=bool(limit and len(ids) > limit)
        )


def _feed(log: FakeLog, runs: list[SimpleNamespace], after: int = 0, page_size: int = 1000) -> LineageFeed:
    return LineageFeed(log, lambda: runs, set(), after=after, page_size=page_size)  # type: ignore[arg-type]


def _drain(feed: LineageFeed, polls: int = 5) -> tuple[list[int], bool]:
    ids: list[int] = []
    ended = False
    for _ in range(polls):
        ready, ended = feed.poll()
        ids += [r.event_id for r in ready]
        if ended:
            break
    return ids, ended


def test_ids_increase_across_the_runs_of_a_lineage() -> None:
    assert decode_id(encode_id(3, 17)) == (3, 17)
    log = FakeLog()
    log.add("r1", 1, 2, 3)
    log.add("r2", 1, 2)  # SQLite: each run's event log numbers from 1
    runs = [SimpleNamespace(run_id="r1", is_finished=True), SimpleNamespace(run_id="r2", is_finished=True)]
    ids, ended = _drain(_feed(log, runs))
    assert ids == [1, 2, 3, RUN_STRIDE + 1, RUN_STRIDE + 2] and ended


def test_records_are_held_one_poll_so_a_late_commit_with_a_lower_id_is_not_skipped() -> None:
    log = FakeLog()
    log.add("r1", 1, 3)  # id 2 allocated, not committed yet
    runs = [SimpleNamespace(run_id="r1", is_finished=False)]
    feed = _feed(log, runs)
    assert feed.poll() == ([], False)  # first sight: held
    log.add("r1", 2)  # the late commit lands before the next poll
    ready, _ = feed.poll()
    assert [r.event_id for r in ready] == [1, 2, 3]


def test_resume_after_a_cursor_and_the_end_of_the_lineage() -> None:
    log = FakeLog()
    log.add("r1", 1, 2, 3)
    run = SimpleNamespace(run_id="r1", is_finished=False)
    feed = _feed(log, [run], after=2)
    ids, ended = _drain(feed, polls=3)
    assert ids == [3] and not ended
    assert not feed.ended_at_cursor()
    log.add("r1", 4)
    run.is_finished = True
    ids, ended = _drain(feed, polls=3)
    assert ids == [4] and ended
    assert feed.ended_at_cursor()


def test_pages_do_not_end_the_lineage_early() -> None:
    log = FakeLog()
    log.add("r1", *range(1, 8))
    feed = _feed(log, [SimpleNamespace(run_id="r1", is_finished=True)], page_size=2)
    ids, ended = _drain(feed, polls=20)
    assert ids == list(range(1, 8)) and ended
