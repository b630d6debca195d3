"""The SSE loop (keepalives, end of stream) and the wire format, without a server."""

from __future__ import annotations

import json

import anyio
import pytest

from durable_assets.ops.sse import KEEPALIVE, ServerSentEvent, SharedFeeds, event_stream, parse_last_event_id


def test_an_event_is_one_block_with_id_event_and_one_data_line() -> None:
    raw = ServerSentEvent(42, "progress", {"label": "a\nb", "done": 1}).encode().decode()
    assert raw.endswith("\n\n")
    lines = raw.rstrip("\n").split("\n")
    assert lines[:2] == ["id: 42", "event: progress"]
    assert len(lines) == 3 and lines[2].startswith("data: ")
    assert json.loads(lines[2][len("data: ") :]) == {"label": "a\nb", "done": 1}


@pytest.mark.parametrize(("raw", "expected"), [(None, None), ("", None), ("17", 17), ("0", 0)])
def test_last_event_id_parses(raw: str | None, expected: int | None) -> None:
    assert parse_last_event_id(raw) == expected


@pytest.mark.parametrize("raw", ["x", " 1", "-1", "1.5", "\uff11\uff12", "1" * 19, "12abc"])
def test_malformed_last_event_id_is_rejected(raw: str) -> None:
    with pytest.raises(ValueError):
        parse_last_event_id(raw)


def _collect(poll_results: list[tuple[list[ServerSentEvent], bool]], heartbeat_s: float) -> list[bytes]:
    calls = iter(poll_results)

    def poll() -> tuple[list[ServerSentEvent], bool]:
        return next(calls)

    async def main() -> list[bytes]:
        return [chunk async for chunk in event_stream(poll, poll_interval_s=0.01, heartbeat_s=heartbeat_s)]

    return anyio.run(main)


def test_silence_gets_keepalives_and_the_stream_ends_when_the_feed_does() -> None:
    event = ServerSentEvent(1, "status", {"status": "succeeded"})
    quiet: list[tuple[list[ServerSentEvent], bool]] = [([], False)] * 30  # >= 0.3 s of silence
    chunks = _collect([*quiet, ([event], True)], heartbeat_s=0.05)
    assert chunks[-1] == event.encode()
    assert chunks.count(KEEPALIVE) >= 2
    assert set(chunks[:-1]) == {KEEPALIVE}


def test_no_keepalive_while_events_flow() -> None:
    events = [([ServerSentEvent(i, "progress", {"done": i})], False) for i in range(1, 20)]
    chunks = _collect([*events, ([], True)], heartbeat_s=10.0)
    assert KEEPALIVE not in chunks and len(chunks) == 19


def test_a_failing_feed_ends_the_stream_instead_of_raising(caplog: pytest.LogCaptureFixture) -> None:
    def poll() -> tuple[list[ServerSentEvent], bool]:
        raise RuntimeError("database went away")

    async def main() -> list[bytes]:
        return [chunk async for chunk in event_stream(poll, poll_interval_s=0.01)]

    assert anyio.run(main) == []
    assert "database went away" in caplog.text


class _Upstream:
    """A feed of events 1..n handed out ``per_poll`` at a time; counts its polls."""

    def __init__(self, n: int, per_poll: int, start: int = 0) -> None:
        self.polls = 0
        self._next = start + 1
        self._n = n
        self._per_poll = per_poll

    def poll(self) -> tuple[list[ServerSentEvent], bool]:
        self.polls += 1
        ids = range(self._next, min(self._next + self._per_poll, self._n + 1))
        self._next = ids.stop
        return [ServerSentEvent(i, "progress", {"done": i}) for i in ids], self._next > self._n


def test_readers_of_one_key_share_one_upstream_poll_per_interval() -> None:
    feeds = SharedFeeds(min_interval_s=60.0)
    upstream = _Upstream(n=5, per_poll=5)
    readers = [feeds.join("b", 0, lambda: upstream.poll) for _ in range(10)]
    results = [poll() for poll, _ in readers]
    assert upstream.polls == 1 and len(feeds) == 1
    assert all([e.id for e in events] == [1, 2, 3, 4, 5] and ended for events, ended in results)
    for _, leave in readers:
        leave()
    assert len(feeds) == 0


def test_a_late_reader_gets_what_follows_its_cursor_from_memory() -> None:
    feeds = SharedFeeds(min_interval_s=0.0)
    upstream = _Upstream(n=6, per_poll=2)
    first, _ = feeds.join("b", 0, lambda: upstream.poll)
    assert [e.id for e in first()[0]] == [1, 2]
    assert [e.id for e in first()[0]] == [3, 4]
    late, _ = feeds.join("b", 1, lambda: pytest.fail("a new upstream for a reader the feed can serve"))
    events, ended = late()  # polls upstream once more (5, 6) and takes 2..6
    assert [e.id for e in events] == [2, 3, 4, 5, 6] and ended
    assert first() == ([ServerSentEvent(i, "progress", {"done": i}) for i in (5, 6)], True)
    assert first() == ([], True)


def test_a_reader_from_before_the_feed_s_start_or_after_its_end_gets_its_own_upstream() -> None:
    feeds = SharedFeeds(min_interval_s=0.0)
    shared = _Upstream(n=10, per_poll=10, start=5)
    poll, _ = feeds.join("b", 5, lambda: shared.poll)
    assert [e.id for e in poll()[0]] == list(range(6, 11))
    own = _Upstream(n=10, per_poll=10)
    earlier, _ = feeds.join("b", 0, lambda: own.poll)
    assert [e.id for e in earlier()[0]] == list(range(1, 11)) and own.polls == 1
    # The first feed has ended: a new reader may see a lineage that has since grown.
    again = _Upstream(n=12, per_poll=12)
    later, _ = feeds.join("b", 0, lambda: again.poll)
    assert [e.id for e in later()[0]][-1] == 12 and again.polls == 1
