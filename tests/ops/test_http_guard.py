"""The header-size count of ops/http_guard.py, fed byte strings directly (no sockets)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from uvicorn.config import Config
from uvicorn.server import ServerState

from durable_assets.ops.http_guard import ConnectionLimits, guarded_protocol

LIMIT = 1024


class _Transport(asyncio.Transport):
    def __init__(self) -> None:
        super().__init__()
        self.written = b""
        self.closed = False

    def write(self, data: bytes | bytearray | memoryview) -> None:
        self.written += bytes(data)

    def close(self) -> None:
        self.closed = True

    def abort(self) -> None:
        self.closed = True

    def is_closing(self) -> bool:
        return self.closed

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return {"sockname": ("127.0.0.1", 8000), "peername": ("127.0.0.1", 50000)}.get(name, default)

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass


async def _app(scope: Any, receive: Any, send: Any) -> None:
    await send({"type": "http.response.start", "status": 204, "headers": []})
    await send({"type": "http.response.body", "body": b""})


def _feed(*chunks: bytes) -> _Transport:
    async def main() -> _Transport:
        limits = ConnectionLimits(max_header_bytes=LIMIT, header_timeout_s=30, max_connections=10)
        config = Config(app=_app, lifespan="off", log_level="error")
        protocol = guarded_protocol(limits)(config, ServerState(), {}, asyncio.get_running_loop())
        transport = _Transport()
        protocol.connection_made(transport)
        for chunk in chunks:
            protocol.data_received(chunk)
        for _ in range(10):  # let the request's task run
            await asyncio.sleep(0)
        protocol.connection_lost(None)
        return transport

    return asyncio.run(main())


def _head(pad: int) -> bytes:
    return b"POST /x HTTP/1.1\r\nHost: x\r\nX-Pad: " + b"a" * pad + b"\r\n"


@pytest.mark.parametrize(
    "chunks",
    [
        # A small head and a body larger than the limit in one read: the body does not count.
        [_head(10) + b"Content-Length: 5000\r\n\r\n" + b"b" * 5000],
        # A head just under the limit, its end split across reads.
        [_head(LIMIT - 80) + b"Content-Length: 0\r", b"\n\r", b"\n"],
    ],
)
def test_heads_within_the_limit_are_served(chunks: list[bytes]) -> None:
    transport = _feed(*chunks)
    assert transport.written.startswith(b"HTTP/1.1 204"), transport.written[:100]


@pytest.mark.parametrize("pieces", [1, 4, 40])
def test_a_head_over_the_limit_is_431_however_it_arrives(pieces: int) -> None:
    head = _head(LIMIT) + b"\r\n"
    size = -(-len(head) // pieces)
    transport = _feed(*[head[i : i + size] for i in range(0, len(head), size)])
    assert transport.written.startswith(b"HTTP/1.1 431"), transport.written[:100]
    assert transport.closed
