"""Server-Sent Events from any pollable, cursor-ordered feed.

The feed is polled from a worker thread (storage reads block), so one slow database read never
stalls the server's event loop. A comment line is sent whenever nothing else was for
``heartbeat_s``: proxies and load balancers close HTTP connections that stay silent, and a client
cannot tell a quiet batch from a dead connection without it.
"""

from __future__ import annotations

import json
import logging
import re
import time
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass
from typing import Any

import anyio
import anyio.to_thread

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
    heartbeat_s: float = 15.0,
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


def parse_last_event_id(raw: str | None) -> int | None:
    """The ``Last-Event-ID`` header as an id; ``None`` when absent. Raises ValueError when malformed."""
    if not raw:  # an empty id is how SSE resets it: start from the beginning
        return None
    if not _EVENT_ID.fullmatch(raw):
        raise ValueError(f"Last-Event-ID must be an event id this server sent (digits), not {raw!r}")
    return int(raw)
