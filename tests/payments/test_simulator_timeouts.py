"""Issue #34: the simulator (`job provider serve`) times out slow clients, heads and bodies alike.

Before, each read had the 60 s keep-alive timeout of its own, so a client that sent one header
line (or one body byte) a minute held its connection and thread forever. Now a request's head and
body must arrive within the request timeout of its first byte (10 s by default; 1 s here, so the
tests are short): then 408 in Stripe's error shape and close. Keep-alive between requests is
unchanged, and a thread per connection means dripping clients never delay an ordinary request.
One test runs the real `job provider serve` at its default.
"""

from __future__ import annotations

import json
import select
import socket
import statistics
import time
from collections.abc import Iterator
from contextlib import ExitStack, closing
from pathlib import Path

import httpx
import pytest

from durable_assets_testing.simulator import build_server
from durable_assets_testing.simulator.server import REQUEST_TIMEOUT_S
from tests.support.machine import scaled
from tests.support.network import ServedInThread, drip_until_closed
from tests.support.simulator import SimulatorProcess

TIMEOUT_S = 1.0
KEY = "sk_test_timeouts"
AUTH = f"Authorization: Bearer {KEY}\r\n".encode()


@pytest.fixture
def sim(tmp_path: Path) -> Iterator[ServedInThread]:
    server = build_server("127.0.0.1", 0, str(tmp_path / "sim.db"), request_timeout_s=TIMEOUT_S)
    with ServedInThread(server, 0.02) as served:
        yield served


def _status(answer: bytes) -> int | None:
    return int(answer.split(b" ", 2)[1]) if answer.startswith(b"HTTP/1.1 ") else None


def _response(sock: socket.socket) -> bytes:
    """One whole response (head and its Content-Length of body) from a kept-alive connection."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        assert chunk, f"closed mid-response: {data[:200]!r}"
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    length = int(
        next(
            v
            for k, _, v in (h.partition(b": ") for h in head.split(b"\r\n"))
            if k.lower() == b"content-length"
        )
    )
    while len(body) < length:
        chunk = sock.recv(65536)
        assert chunk, "closed mid-body"
        body += chunk
    return head + b"\r\n\r\n" + body


def _connect(port: int) -> socket.socket:
    return socket.create_connection(("127.0.0.1", port), timeout=10)


def _ordinary(url: str) -> float:
    start = time.perf_counter()
    response = httpx.get(f"{url}/v1/refunds", headers={"Authorization": f"Bearer {KEY}"}, timeout=30)
    assert response.status_code == 200, response.text
    return time.perf_counter() - start


def test_a_dripping_head_is_408_at_the_request_timeout_and_ordinary_requests_are_not_delayed(
    sim: ServedInThread,
) -> None:
    url = f"http://127.0.0.1:{sim.port}"
    idle = [_ordinary(url) for _ in range(5)]
    with ExitStack() as stack:
        socks = [stack.enter_context(closing(_connect(sim.port))) for _ in range(50)]
        opened = time.monotonic()
        for s in socks:
            s.sendall(b"GET /v1/refunds HTTP/1.1\r\nHost: x\r\n")
        loaded = [_ordinary(url) for _ in range(5)]  # while 50 heads are incomplete
        closed_after, answers = drip_until_closed(socks, b"X-Drip: 1\r\n", 0.2, scaled(TIMEOUT_S + 5), opened)
    times = sorted(closed_after.values())
    print(
        f"\n50 dripping heads: closed after {times[0]:.2f}..{times[-1]:.2f} s; GET /v1/refunds median "
        f"{statistics.median(idle) * 1000:.1f} ms idle, {statistics.median(loaded) * 1000:.1f} ms beside them"
    )
    assert len(closed_after) == 50, "a dripping head held its connection past the timeout"
    assert times[0] >= TIMEOUT_S - 0.3, times  # the drip did not end them early
    for answer in answers.values():
        assert _status(answer) == 408, answer[:200]
        error = json.loads(answer.partition(b"\r\n\r\n")[2])["error"]
        assert error["type"] == "invalid_request_error" and "not complete within 1 s" in error["message"]
    assert max(loaded) < 1.0, loaded


def test_a_dripping_body_is_408_at_the_request_timeout_and_nothing_is_done(sim: ServedInThread) -> None:
    server = sim.server
    before = server.stats()  # type: ignore[attr-defined]
    with closing(_connect(sim.port)) as sock:
        sock.sendall(
            b"POST /v1/customers HTTP/1.1\r\nHost: x\r\nContent-Type: application/x-www-form-urlencoded\r\n"
            + AUTH
            + b"Content-Length: 1000\r\n\r\nemail="
        )
        closed_after, answers = drip_until_closed([sock], b"a", 0.2, scaled(TIMEOUT_S + 5), time.monotonic())
    assert sock in closed_after, "a dripping body held its connection past the timeout"
    assert closed_after[sock] >= TIMEOUT_S - 0.3, closed_after
    assert _status(answers[sock]) == 408, answers[sock][:200]
    after = server.stats()  # type: ignore[attr-defined]
    assert after["customers_created"] == before["customers_created"]  # a partial body asks nothing
    print(f"\ndripping body: 408 after {closed_after[sock]:.2f} s")


def test_keep_alive_between_requests_is_not_the_request_timeout(sim: ServedInThread) -> None:
    request = b"GET /v1/refunds HTTP/1.1\r\nHost: x\r\n" + AUTH + b"\r\n"
    with closing(_connect(sim.port)) as sock:
        sock.sendall(request)
        first = _response(sock)
        assert _status(first) == 200, first[:200]
        # Idle for twice the request timeout: a kept-alive connection is not a slow request.
        readable, _, _ = select.select([sock], [], [], 2 * TIMEOUT_S)
        assert readable == [], "the server closed an idle kept-alive connection at the request timeout"
        sock.sendall(request)
        assert _status(_response(sock)) == 200


@pytest.mark.slow
def test_job_provider_serve_cuts_a_dripping_head_at_its_default(tmp_path: Path) -> None:
    with SimulatorProcess(tmp_path / "sim.db") as served, ExitStack() as stack:
        port = int(served.url.rsplit(":", 1)[1])
        socks = [stack.enter_context(closing(_connect(port))) for _ in range(10)]
        opened = time.monotonic()
        for s in socks:
            s.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n")
        closed_after, answers = drip_until_closed(
            socks, b"X-Drip: 1\r\n", 1.0, scaled(REQUEST_TIMEOUT_S + 10), opened
        )
    times = sorted(closed_after.values())
    assert len(times) == 10, f"{10 - len(times)} dripping heads still open"
    assert times[0] >= REQUEST_TIMEOUT_S - 0.5, times
    assert all(_status(a) == 408 for a in answers.values())
    print(f"\n`job provider serve`: 10 dripping heads closed after {times[0]:.2f}..{times[-1]:.2f} s")
