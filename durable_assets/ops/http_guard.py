"""Connection-level limits for a uvicorn server: header size, header time, connections.

uvicorn enforces none of them by default: with httptools there is no header size limit at all (a
150 MB header is read before the app can answer 401), no parser times out a request head that
never finishes (Slowloris), and ``limit_concurrency`` counts every open connection, so
connections that never send a head fill it and ordinary requests get 503. This module is a small
subclass of uvicorn's h11 protocol that adds the limits below the application (they must hold
before any token is checked):

- **Header size.** Bytes received while a request head is incomplete are counted; past
  ``max_header_bytes`` the client gets 431 and the connection is closed. h11's own buffer limit
  stays as a backstop, set above ours.
- **Header time.** A request head must be complete ``header_timeout_s`` after its first byte, or
  after the connection opened; otherwise 408 and close. A request body, if any, must be complete
  by the same deadline (no route here reads one); otherwise the connection is closed. An idle
  keep-alive connection is closed by uvicorn's ``timeout_keep_alive``.
- **Requests in progress.** Up to ``max_connections`` connections may have a request in progress
  (its head arrived, its answer is not complete: an event stream counts until it ends); a request
  past that gets 503 with a JSON body that names the cap and the setting that raises it, except
  ``/healthz`` (a liveness probe must not fail because of load). The decision is made when the
  head has arrived, so connections that are *stalled* (a head or body still arriving, or idle
  between requests) never count: before issue #34 the cap counted every open connection, and 256
  connections that sent half a head made every ordinary request a 503.
- **Stalled connections.** One client address may hold ``max_stalled_per_client`` stalled
  connections; one more closes its oldest. All together, open connections stay within twice
  ``max_connections``: past that a new connection closes the oldest stalled one of any client.
  A real client sends its head in the packet after the handshake, so the ones closed are the
  stalled, and a fresh client still gets in; only when every connection has a request in progress
  is the new one closed at once.

The answers written here are raw HTTP/1.1: h11 cannot send a response before it has parsed a
request.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import h11
from starlette.types import ASGIApp, Receive, Scope, Send
from uvicorn.config import Config
from uvicorn.protocols.http.h11_impl import H11Protocol
from uvicorn.server import ServerState

#: h11 raises (and uvicorn answers 400) once its receive buffer holds this much more than our
#: limit without a complete event: a backstop only, for data that arrives in one huge chunk.
_H11_BACKSTOP_SLACK = 64 * 1024
_HEAD_END = b"\r\n\r\n"


@dataclass(frozen=True)
class ConnectionLimits:
    max_header_bytes: int
    header_timeout_s: float
    max_connections: int
    max_stalled_per_client: int = 16
    #: Settings names, for the error bodies (a client must learn which knob raises the cap).
    header_bytes_setting: str = "max_header_bytes"
    header_timeout_setting: str = "header_timeout_s"
    connections_setting: str = "max_connections"
    #: Served even past the connection cap.
    always_served: frozenset[str] = frozenset({"/healthz"})

    @property
    def h11_max_incomplete_event_size(self) -> int:
        return self.max_header_bytes + _H11_BACKSTOP_SLACK


def raw_json_response(status: int, reason: str, body: dict[str, Any]) -> bytes:
    payload = json.dumps(body).encode()
    head = (
        f"HTTP/1.1 {status} {reason}\r\ncontent-type: application/json\r\n"
        f"content-length: {len(payload)}\r\nconnection: close\r\n\r\n"
    )
    return head.encode() + payload


#: Seconds a client is told to wait (``Retry-After``) before trying again past a cap.
RETRY_AFTER_S = 5


def over_capacity_body(cap: str, limit: int, setting: str) -> dict[str, Any]:
    """The 503 body: which cap is full, its value and the setting that raises it."""
    return {
        "error": "over_capacity",
        "cap": cap,
        "limit": limit,
        "setting": setting,
        "message": f"the server is at its cap of {limit} {cap.replace('_', ' ')}; "
        f"retry later, or raise {setting}",
    }


def over_capacity_app(cap: int, setting: str) -> ASGIApp:
    """The 503 (and close) for a request past the cap of requests in progress."""
    body = json.dumps(over_capacity_body("connections", cap, setting)).encode()

    async def refuse(scope: Scope, receive: Receive, send: Send) -> None:
        headers = [
            (b"content-type", b"application/json"),
            (b"content-length", str(len(body)).encode()),
            (b"retry-after", str(RETRY_AFTER_S).encode()),
            (b"connection", b"close"),
        ]
        await send({"type": "http.response.start", "status": 503, "headers": headers})
        await send({"type": "http.response.body", "body": body})

    return refuse


class GuardedH11Protocol(H11Protocol):
    """uvicorn's h11 protocol plus :class:`ConnectionLimits` (set by :func:`guarded_protocol`)."""

    limits: ConnectionLimits

    def __init__(
        self,
        config: Config,
        server_state: ServerState,
        app_state: dict[str, Any],
        _loop: asyncio.AbstractEventLoop | None = None,
    ) -> None:
        super().__init__(config, server_state, app_state, _loop)
        self._head_bytes = 0
        self._head_tail = b""  # the last bytes seen, to find a head end split across two reads
        self._head_timer: asyncio.TimerHandle | None = None
        self._opened_at = 0.0
        # uvicorn hands every request of this connection to ``self.app``: the cap is decided there,
        # once the request's head has arrived.
        self._served_app = self.app
        self._refused_app = over_capacity_app(self.limits.max_connections, self.limits.connections_setting)
        self.app = self._admit  # type: ignore[assignment]

    # --- requests in progress ---

    def _busy(self) -> bool:
        """A request in progress: its head arrived and its answer is not complete."""
        cycle = self.cycle
        return cycle is not None and not cycle.response_complete and not self.transport.is_closing()

    def _stalled(self) -> bool:
        """Open with no request in progress: a head or body still arriving, or idle between requests."""
        return not self._busy() and not self.transport.is_closing()

    def _others(self) -> list[GuardedH11Protocol]:
        return [p for p in self.connections if isinstance(p, GuardedH11Protocol) and p is not self]

    async def _admit(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["path"] not in self.limits.always_served:
            busy = sum(1 for p in self._others() if p._busy())
            if busy >= self.limits.max_connections:
                self.logger.warning(
                    "request refused: %d requests in progress (cap %d)", busy, self.limits.max_connections
                )
                await self._refused_app(scope, receive, send)
                return
        await self._served_app(scope, receive, send)

    # --- connections ---

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._opened_at = self.loop.time()
        host = self.client[0] if self.client else None
        if host is not None:
            mine = [p for p in self._others() if p.client and p.client[0] == host and p._stalled()]
            if len(mine) >= self.limits.max_stalled_per_client:
                min(mine, key=lambda p: p._opened_at)._evict()
        cap = self.limits.max_connections
        # An evicted connection leaves ``connections`` only on the loop's next turn: not counted.
        open_now = sum(1 for p in self.connections if not p.transport.is_closing())
        if open_now > 2 * cap:
            victim = min(
                (p for p in self._others() if p._stalled()), key=lambda p: p._opened_at, default=None
            )
            if victim is None:
                # Every connection is busy with a request: not even a head is read from this one.
                self.logger.warning(
                    "connection refused: %d open, all busy (cap %d)", len(self.connections), cap
                )
                transport.abort()
                return
            victim._evict()
        self._arm_head_timer()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm_head_timer()
        super().connection_lost(exc)

    def _evict(self) -> None:
        """Close a stalled connection to make room (it has no request in progress to answer)."""
        self._disarm_head_timer()
        self.transport.abort()

    # --- the request head: size and time ---

    def data_received(self, data: bytes) -> None:
        if self.conn.their_state is h11.IDLE:
            self._arm_head_timer()
            seen = self._head_tail + data
            end = seen.find(_HEAD_END)
            head = self._head_bytes + (len(data) if end < 0 else end + len(_HEAD_END) - len(self._head_tail))
            if head > self.limits.max_header_bytes:
                self._refuse(
                    431,
                    "Request Header Fields Too Large",
                    "header_too_large",
                    f"request head over {self.limits.max_header_bytes} bytes",
                    self.limits.header_bytes_setting,
                )
                return
            self._head_bytes += len(data)
            self._head_tail = seen[-(len(_HEAD_END) - 1) :]
        super().data_received(data)
        if self.conn.their_state is not h11.IDLE:  # a head arrived (or the connection failed)
            self._head_bytes = 0
            self._head_tail = b""
            if self.conn.their_state is not h11.SEND_BODY:  # a body is held to the same clock
                self._disarm_head_timer()

    def _arm_head_timer(self) -> None:
        if self._head_timer is None and not self.transport.is_closing():
            self._head_timer = self.loop.call_later(self.limits.header_timeout_s, self._head_timed_out)

    def _disarm_head_timer(self) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None

    def _head_timed_out(self) -> None:
        self._head_timer = None
        if self.transport.is_closing():
            return
        if self.conn.their_state is h11.SEND_BODY:
            # The head came, its body does not: no route here reads a body, and a response may
            # already be on its way, so the connection is just closed.
            self.logger.warning("request body from %s not complete in time: closing", self.client)
            self.transport.close()
        elif self.conn.their_state is h11.IDLE:
            self._refuse(
                408,
                "Request Timeout",
                "header_timeout",
                f"request head not complete within {self.limits.header_timeout_s:g} s",
                self.limits.header_timeout_setting,
            )

    def on_response_complete(self) -> None:
        super().on_response_complete()
        # The next request on this connection starts its own head clock with its first byte;
        # until then uvicorn's keep-alive timeout is what closes an idle connection. A body still
        # arriving keeps its clock: data resets uvicorn's keep-alive timer, so nothing else would.
        if self.conn.their_state is not h11.SEND_BODY:
            self._disarm_head_timer()

    def _refuse(self, status: int, reason: str, code: str, what: str, setting: str) -> None:
        self._disarm_head_timer()
        self.logger.warning("%s from %s: closing the connection", what, self.client)
        message = f"{what}; the server's limit is set by {setting}"
        body = {"error": code, "message": message, "setting": setting}
        self.transport.write(raw_json_response(status, reason, body))
        self.transport.close()


def guarded_protocol(limits: ConnectionLimits) -> Callable[..., GuardedH11Protocol]:
    """A protocol class for ``uvicorn.Config(http=...)`` enforcing ``limits``."""
    return type("GuardedH11Protocol", (GuardedH11Protocol,), {"limits": limits})
