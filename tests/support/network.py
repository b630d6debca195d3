"""Ports and in-process servers for tests and the benchmark.

A free port per server, so parallel runs never collide on a fixed one; a server in a thread of the
caller (the simulator, a webhook receiver, a fake provider) that is always shut down.
"""

from __future__ import annotations

import select
import socket
import socketserver
import threading
import time
from contextlib import suppress
from typing import Self

#: The broker the distributed tests and bench scenario 10 use (these machines run RabbitMQ there).
DEFAULT_BROKER_URL = "pyamqp://guest@127.0.0.1:5672//"


def free_port(host: str = "127.0.0.1") -> int:
    """A port nothing listens on right now (the kernel's pick, released at once).

    Good for a child process that needs its port on the command line, and for "a port nobody
    listens on" (connection refused). Another process could take it in between; on a test machine
    that race has not been seen, and a bind error would name the port.
    """
    with socket.socket() as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


class Closing:
    """``with X(...) as x:`` for anything with a ``close()``: what a test starts, it stops."""

    def close(self) -> None:
        raise NotImplementedError

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class ServedInThread(Closing):
    """A ``socketserver`` server (``ThreadingHTTPServer``, the simulator) serving from a daemon thread
    of the caller until :meth:`close`: it outlives any process a test kills, and the test can read
    or reconfigure it directly. A context manager, so a test cannot forget to shut it down."""

    def __init__(self, server: socketserver.BaseServer, poll_interval: float = 0.05) -> None:
        self.server = server
        self._thread = threading.Thread(
            target=server.serve_forever, kwargs={"poll_interval": poll_interval}, daemon=True
        )
        self._thread.start()

    @property
    def port(self) -> int:
        return int(self.server.server_address[1])  # type: ignore[index]

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self._thread.join(timeout=10)


def broker_available(url: str = DEFAULT_BROKER_URL) -> bool:
    """Whether the AMQP broker at ``url`` accepts a connection within a few seconds."""
    try:
        from kombu import Connection

        with Connection(url, connect_timeout=3) as conn:
            conn.ensure_connection(max_retries=1)
        return True
    except Exception:
        return False


def drip_until_closed(
    socks: list[socket.socket], drip: bytes, every_s: float, give_up_s: float, opened: float
) -> tuple[dict[socket.socket, float], dict[socket.socket, bytes]]:
    """Send ``drip`` on each socket every ``every_s`` until the server closes it (or ``give_up_s``):
    when each was closed (seconds after ``opened``, a ``time.monotonic()``) and what it was answered.

    The slow-client tests of the status API and of the simulator drip the same way: one loop, so
    both servers' timeouts are measured alike."""
    closed_after: dict[socket.socket, float] = {}
    answers: dict[socket.socket, bytes] = {s: b"" for s in socks}
    next_drip = opened + every_s
    while len(closed_after) < len(socks) and time.monotonic() - opened < give_up_s:
        open_ones = [s for s in socks if s not in closed_after]
        readable, _, _ = select.select(open_ones, [], [], 0.05)
        for s in readable:
            try:
                chunk = s.recv(4096)
            except ConnectionResetError:
                chunk = b""
            answers[s] += chunk
            if not chunk:
                closed_after[s] = time.monotonic() - opened
        if time.monotonic() >= next_drip:
            for s in open_ones:
                with suppress(OSError):
                    s.sendall(drip)
            next_drip += every_s
    return closed_after, answers
