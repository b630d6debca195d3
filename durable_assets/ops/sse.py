"""Server-Sent Events from any pollable, cursor-ordered feed.

The feed is polled from a worker thread (storage reads block), so one slow database read never
stalls the server's event loop. A comment line is sent whenever nothing else was for
``heartbeat_s``: proxies and load balancers close HTTP connections that stay silent, and a client
cannot tell a quiet batch from a dead connection without it.

Streams of the same feed share one upstream poll (:class:`SharedFeeds`): a hundred dashboards
watching one batch cost one storage read per interval, not a hundred.
"""

from __future__ import annotations

import bisect
import json
import logging
import re
import threading
import time
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass
from typing import Any

import anyio
import anyio.to_thread

from durable_assets.ops.settings import ApiSettings

logger = logging.getLogger(__name__)

KEEPALIVE = b": keepalive\n\n"
_EVENT_ID = re.compile(r"[0-9]{1,18}")


@dataclass(frozen=True)
class ServerSentEvent:
    id: int
    event: str
    data: dict[str, Any]

    def encode(self) -> bytes:
        # JSON never contains a raw newline, so the payload is always exactly one `data:` line.
        body = json.dumps(self.data, separators=(",", ":"), sort_keys=True)
        return f"id: {self.id}\nevent: {self.event}\ndata: {body}\n\n".encode()


#: One poll: the events now ready (in id order) and whether the feed has ended.
Poll = Callable[[], tuple[Sequence[ServerSentEvent], bool]]


async def event_stream(
    poll: Poll,
    *,
    poll_interval_s: float = 0.25,
    heartbeat_s: float = ApiSettings.model_fields["heartbeat_s"].default,
    limiter: anyio.CapacityLimiter | None = None,
) -> AsyncIterator[bytes]:
    """Yield encoded events until ``poll`` reports the end; keepalive comments in the silences.

    ``limiter`` bounds the threads that polls of all streams may occupy together: without one they
    share the default thread pool with every other blocking call of the server, and a few hundred
    streams polling four times a second queue the server's other reads behind theirs.
    """
    last_sent = time.monotonic()
    while True:
        try:
            events, done = await anyio.to_thread.run_sync(poll, limiter=limiter)
        except Exception:
            # The status line went out long ago, so a 500 is impossible: end the stream, and the
            # client reconnects with Last-Event-ID (which loses and repeats nothing).
            logger.exception("event stream stopped: reading the feed failed")
            return
        for event in events:
            yield event.encode()
            last_sent = time.monotonic()
        if done:
            return
        if time.monotonic() - last_sent >= heartbeat_s:
            yield KEEPALIVE
            last_sent = time.monotonic()
        await anyio.sleep(min(poll_interval_s, max(heartbeat_s - (time.monotonic() - last_sent), 0.0)))


class SharedFeed:
    """One upstream feed, polled at most once per ``min_interval_s`` whatever the number of readers.

    Every event the upstream has handed out is kept (in id order) while the feed has readers, so
    a reader that joins late, or polls late, takes what it has not had from memory.
    """

    def __init__(self, upstream: Poll, start: int, min_interval_s: float) -> None:
        self.start = start
        self.readers = 0
        self._upstream = upstream
        self._min_interval_s = min_interval_s
        self._lock = threading.Lock()
        self._events: list[ServerSentEvent] = []
        self._ids: list[int] = []
        self._ended = False
        self._polled_at = float("-inf")

    @property
    def ended(self) -> bool:
        return self._ended

    def reader(self, after: int) -> Poll:
        """A poll for one stream: the events after its own cursor, and whether it has them all."""
        cursor = after

        def poll() -> tuple[Sequence[ServerSentEvent], bool]:
            nonlocal cursor
            with self._lock:
                if not self._ended and time.monotonic() - self._polled_at >= self._min_interval_s:
                    try:
                        events, done = self._upstream()
                    finally:
                        self._polled_at = time.monotonic()
                    self._events += events
                    self._ids += [e.id for e in events]
                    self._ended = done
                fresh = self._events[bisect.bisect_right(self._ids, cursor) :]
                ended = self._ended
            if fresh:
                cursor = fresh[-1].id
            return fresh, ended

        return poll


class SharedFeeds:
    """Readers of the same key share one :class:`SharedFeed` (see the module docstring)."""

    def __init__(self, min_interval_s: float) -> None:
        self.min_interval_s = min_interval_s
        self._feeds: dict[str, SharedFeed] = {}
        self._lock = threading.Lock()

    def join(self, key: str, after: int, upstream: Callable[[], Poll]) -> tuple[Poll, Callable[[], None]]:
        """A poll for a reader of ``key`` from ``after``, and the call that ends its reading.

        ``upstream()`` makes a feed's own poll from ``after``; it is called only when no open feed
        of ``key`` can serve this reader (none yet, or one that started after ``after``, or one
        that has ended: a re-execution may since have continued the lineage).
        """
        with self._lock:
            feed = self._feeds.get(key)
            if feed is None or feed.start > after or feed.ended:
                feed = SharedFeed(upstream(), after, self.min_interval_s)
                if key not in self._feeds or self._feeds[key].ended:
                    self._feeds[key] = feed
            feed.readers += 1

        def leave() -> None:
            with self._lock:
                feed.readers -= 1
                if feed.readers == 0 and self._feeds.get(key) is feed:
                    del self._feeds[key]

        return feed.reader(after), leave

    def __len__(self) -> int:
        return len(self._feeds)


def parse_last_event_id(raw: str | None) -> int | None:
    """The ``Last-Event-ID`` header as an id; ``None`` when absent. Raises ValueError when malformed."""
    if not raw:  # an empty id is how SSE resets it: start from the beginning
        return None
    if not _EVENT_ID.fullmatch(raw):
        raise ValueError(f"Last-Event-ID must be an event id this server sent (digits), not {raw!r}")
    return int(raw)
