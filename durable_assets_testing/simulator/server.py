"""The simulator's HTTP server: a thread per kept-alive connection, faults drawn from one seeded
RNG, and the order of checks every ``/v1`` request goes through (see the package docstring)."""

from __future__ import annotations

import io
import json
import logging
import random
import secrets
import socket
import socketserver
import sys
import threading
import time
from collections.abc import Iterable
from contextlib import suppress
from dataclasses import replace
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, NoReturn

from durable_assets.payments.params import StripeApiError, invalid_request
from durable_assets.payments.store import PaymentStore
from durable_assets_testing.simulator.auth import ApiKeys, api_key_from, mask_api_key
from durable_assets_testing.simulator.faults import Faults, TokenBucket
from durable_assets_testing.simulator.responses import (
    MISSING_KEY,
    Response,
    api_error,
    error_response,
    key_in_use,
    rate_limited,
    unauthorized,
    unrecognized,
)
from durable_assets_testing.simulator.routes import Route, match_route, run_route

log = logging.getLogger(__name__)


class _ClientGone(Exception):
    """The client closed the connection before its request was complete."""


class _RequestTimedOut(TimeoutError):
    """A request's head and body did not arrive within the request timeout of its first byte."""


_MAX_BODY_BYTES = 1 << 20
_IDLE_KEEPALIVE_S = 60.0
_DRAIN_TIMEOUT_S = 5.0
#: Seconds a request's head and body may take from its first byte; then 408 and close. Dripping a
#: header line or a body byte at a time does not extend it (Slowloris).
REQUEST_TIMEOUT_S = 10.0


class _RequestClock(io.RawIOBase):
    """A connection's reads, each request held to one deadline from its first byte.

    Between requests a read waits up to the keep-alive idle time; the first byte of a request
    starts the clock, and every later read of that request (head lines, body) gets only what is
    left of it. A socket timeout alone is per read, so a client sending one byte a minute held its
    thread forever. Past the deadline the client gets 408 (no response has started: the simulator
    answers only after a whole request) and the connection is closed.
    """

    def __init__(self, sock: socket.socket, idle_s: float, request_s: float) -> None:
        super().__init__()
        self._sock = sock
        self._idle_s = idle_s
        self._request_s = request_s
        self._deadline: float | None = None

    def readable(self) -> bool:
        return True

    def next_request(self) -> None:
        """The previous request is complete: the next one's clock starts with its first byte."""
        self._deadline = None

    def readinto(self, buffer: Any) -> int:
        if self._deadline is None:
            self._sock.settimeout(self._idle_s)
        else:
            left = self._deadline - time.monotonic()
            if left <= 0:
                self._time_out()
            self._sock.settimeout(left)
        try:
            n = self._sock.recv_into(buffer)
        except TimeoutError:
            if self._deadline is None:
                raise  # idle past the keep-alive time: closed without a word, as before
            self._time_out()
        finally:
            self._sock.settimeout(self._idle_s)  # what writes wait for
        if n and self._deadline is None:
            self._deadline = time.monotonic() + self._request_s
        return n

    def _time_out(self) -> NoReturn:
        message = (
            f"The request was not complete within {self._request_s:g} s of its first byte; "
            "the connection is closed."
        )
        body = json.dumps({"error": {"type": "invalid_request_error", "message": message}}).encode()
        head = (
            f"HTTP/1.1 408 Request Timeout\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n"
        )
        with suppress(OSError):
            self._sock.settimeout(1.0)
            self._sock.sendall(head.encode() + body)
        raise _RequestTimedOut(message)


class SimulatorServer(ThreadingHTTPServer):
    """A thread per connection; connections are kept alive, so a client thread costs one server thread.

    Fault draws come from one seeded RNG under a lock: a sequential client sees the same faults
    for the same seed.
    """

    daemon_threads = True
    allow_reuse_address = True
    request_queue_size = 1024

    def __init__(
        self,
        address: tuple[str, int],
        store: PaymentStore,
        faults: Faults,
        seed: int | None,
        api_keys: ApiKeys | None = None,
        request_timeout_s: float = REQUEST_TIMEOUT_S,
    ) -> None:
        self.store = store
        self.api_keys = api_keys or ApiKeys()
        self.request_timeout_s = request_timeout_s
        self._faults = faults
        self._bucket = _bucket_for(faults)
        self._rng = random.Random(seed)
        self._lock = threading.Lock()
        self._in_flight: set[tuple[str, str]] = set()
        self._requests = 0
        self._rate_limited = 0
        self._connections: set[socket.socket] = set()
        self._idle = threading.Condition(self._lock)
        super().__init__(address, SimulatorHandler)

    def server_bind(self) -> None:
        """Skips ``HTTPServer``'s reverse-DNS lookup of the host, which can stall startup."""
        socketserver.TCPServer.server_bind(self)
        host, port = self.server_address[:2]
        self.server_name = str(host)
        self.server_port = int(port)

    @property
    def port(self) -> int:
        return int(self.server_address[1])

    @property
    def url(self) -> str:
        return f"http://{self.server_name}:{self.port}"

    @property
    def faults(self) -> Faults:
        return self._faults

    def configure(self, **changes: Any) -> None:
        """Changes faults while serving (tests switch a fault on for exactly one request)."""
        faults = replace(self._faults, **changes)
        with self._lock:
            self._faults = faults
            self._bucket = _bucket_for(faults)

    def admit(self) -> float | None:
        """The rate limiter's verdict: ``None`` to proceed, else seconds to wait."""
        bucket = self._bucket
        wait = None if bucket is None else bucket.take()
        if wait is not None:
            with self._lock:
                self._rate_limited += 1
        return wait

    def received(self) -> None:
        """Counts one ``/v1`` request, before anything can reject it."""
        with self._lock:
            self._requests += 1

    def stats(self) -> dict[str, int]:
        """The store's counters plus this process's ``requests`` and ``rate_limited``."""
        with self._lock:
            requests, limited = self._requests, self._rate_limited
        return {**self.store.stats(), "requests": requests, "rate_limited": limited}

    def roll(self, rate: float) -> bool:
        if rate <= 0.0:
            return False
        with self._lock:
            return self._rng.random() < rate

    def claim(self, scope: tuple[str, str]) -> bool:
        """Marks an idempotency key as being processed; ``False`` if another request holds it."""
        with self._lock:
            if scope in self._in_flight:
                return False
            self._in_flight.add(scope)
            return True

    def release(self, scope: tuple[str, str]) -> None:
        with self._lock:
            self._in_flight.discard(scope)

    def in_flight_count(self) -> int:
        with self._lock:
            return len(self._in_flight)

    def track(self, connection: socket.socket) -> None:
        with self._lock:
            self._connections.add(connection)

    def untrack(self, connection: socket.socket) -> None:
        with self._idle:
            self._connections.discard(connection)
            self._idle.notify_all()

    def server_close(self) -> None:
        """Also ends kept-alive connections and waits for running requests before closing the store,
        so a stopped server leaves no thread writing to a closed database."""
        super().server_close()
        with self._idle:
            for connection in list(self._connections):
                with suppress(OSError):
                    connection.shutdown(socket.SHUT_RDWR)
            self._idle.wait_for(lambda: not self._connections, timeout=_DRAIN_TIMEOUT_S)
        self.store.close()


def _bucket_for(faults: Faults) -> TokenBucket | None:
    return None if faults.rate_limit is None else TokenBucket(faults.rate_limit)


def build_server(
    host: str,
    port: int,
    db_path: str,
    faults: Faults | None = None,
    *,
    seed: int | None = None,
    api_keys: Iterable[str] = (),
    request_timeout_s: float = REQUEST_TIMEOUT_S,
) -> SimulatorServer:
    """Binds (``port=0`` picks a free port; read it from ``server.port``) without serving yet.

    Run it with ``server.serve_forever()`` (in a thread for tests), stop it with
    ``server.shutdown()`` then ``server.server_close()``. ``faults`` unset: a polite server;
    ``api_keys`` empty: any ``sk_test_`` key. ``request_timeout_s``: how long a request's head
    and body may take from its first byte (then 408 and close).
    """
    keys = ApiKeys.of(api_keys)
    store = PaymentStore(db_path)
    try:
        return SimulatorServer((host, port), store, faults or Faults(), seed, keys, request_timeout_s)
    except BaseException:
        store.close()
        raise


def serve(server: SimulatorServer) -> None:
    """Serves a :func:`build_server` server until interrupted, then closes it; one line on stderr
    says where, nothing per request."""
    print(
        f"payment simulator listening on {server.url} (db: {server.store.path})", file=sys.stderr, flush=True
    )
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()


class SimulatorHandler(BaseHTTPRequestHandler):
    """HTTP/1.1 with keep-alive, because the SDK pools connections and reconnecting per request
    would make the simulator, not the pipeline, the bottleneck."""

    protocol_version = "HTTP/1.1"
    # Headers and body go out in two writes; with Nagle on, the body waits for the client's
    # delayed ACK (~40 ms), which capped throughput at ~200 req/s regardless of latency settings.
    disable_nagle_algorithm = True
    server_version = "durable-assets-payment-simulator"
    timeout = _IDLE_KEEPALIVE_S
    server: SimulatorServer

    def setup(self) -> None:
        super().setup()
        self.rfile.close()  # the base class's reader, replaced by one that keeps the request clock
        self._clock = _RequestClock(self.connection, _IDLE_KEEPALIVE_S, self.server.request_timeout_s)
        self.rfile = io.BufferedReader(self._clock)
        self.server.track(self.connection)

    def handle_one_request(self) -> None:
        # A timed-out head ends here: the base class takes any TimeoutError as "close the connection".
        self._clock.next_request()
        super().handle_one_request()

    def finish(self) -> None:
        try:
            super().finish()
        finally:
            self.server.untrack(self.connection)

    def log_message(self, format: str, *args: Any) -> None:
        """Silent per request: at hundreds of requests/s an access log is noise and a bottleneck."""

    def do_GET(self) -> None:
        self._dispatch()

    def do_POST(self) -> None:
        self._dispatch()

    def do_DELETE(self) -> None:
        self._dispatch()

    def _dispatch(self) -> None:
        try:
            self._handle()
        except Exception:
            log.exception("payment simulator: unexpected error on %s %s", self.command, self.path)
            self.close_connection = True
            with suppress(OSError):
                self._send(api_error("An unexpected error occurred in the simulator."))

    def _handle(self) -> None:
        path, _, query = self.path.partition("?")
        if path == "/v1" or path.startswith("/v1/"):
            self.server.received()
        try:
            body = self._read_body()
        except (_ClientGone, _RequestTimedOut):  # a timed-out body has had its 408
            self.close_connection = True
            return
        except StripeApiError as error:
            self.close_connection = True
            self._send(error_response(error))
            return
        if path == "/healthz":
            self._send(Response(200, {"status": "ok"}))
        elif path == "/_sim/stats" and self.command == "GET":
            self._send(Response(200, dict(self.server.stats())))
        else:
            self._handle_api(path, query if self.command == "GET" else body)

    def _read_body(self) -> str:
        """The whole body, or :class:`_ClientGone` when the connection ended before it did."""
        if "chunked" in self.headers.get("Transfer-Encoding", "").lower():
            raise invalid_request("Chunked request bodies are not supported; send Content-Length.")
        raw_length = self.headers.get("Content-Length") or "0"
        if not raw_length.isdigit() or int(raw_length) > _MAX_BODY_BYTES:
            raise invalid_request(f"Invalid Content-Length: {raw_length!r}.")
        length = int(raw_length)
        data = self.rfile.read(length)
        if len(data) < length:
            # The client went away mid-body (a killed worker): nothing was asked, nothing is done. A
            # request processed from a partial body would bind its idempotency key to parameters the
            # client never sent, and the client's retry with the whole body would be refused.
            raise _ClientGone
        try:
            return data.decode("utf-8")
        except UnicodeDecodeError:
            raise invalid_request("The request body is not valid UTF-8.") from None

    def _handle_api(self, path: str, encoded_params: str) -> None:
        route = match_route(self.command, path)
        if route is None:
            self._send(unrecognized(self.command, path))
        elif (rejection := self._authenticate()) is not None:
            self._send(rejection)
        else:
            if route.counts_refund_request:  # received, even if a fault answers it below
                self.server.store.record_refund_request()
            if (wait := self.server.admit()) is not None:
                self._send(rate_limited(wait))
            else:
                self._handle_admitted(route, encoded_params)

    def _authenticate(self) -> Response | None:
        """``None`` when the request carries an accepted key, else Stripe's 400 or 401 for its case.

        Two ``Authorization`` headers are refused outright: which one a server or a proxy on the
        way reads is not defined, so one could authenticate a request the other did not mean.
        """
        if len(self.headers.get_all("Authorization") or []) > 1:
            return error_response(
                invalid_request(
                    "The request has more than one Authorization header; send your API key in exactly one."
                )
            )
        key = api_key_from(self.headers.get("Authorization"))
        if not key:
            return unauthorized(MISSING_KEY)
        if not self.server.api_keys.accepts(key):
            return unauthorized(f"Invalid API Key provided: {mask_api_key(key)}")
        return None

    def _handle_admitted(self, route: Route, encoded_params: str) -> None:
        """Holds the key's in-flight mark across latency and processing, as Stripe does.

        The mark is released before the answer is written: once committed, the stored result
        answers retries, and a client that got its answer must never see its own key as busy.
        """
        key = self.headers.get("Idempotency-Key") if self.command == "POST" else None
        scope = (route.name, key) if key else None
        if scope is not None and not self.server.claim(scope):
            self._sleep_latency()
            self._send(key_in_use(scope[1]))
            return
        try:
            self._sleep_latency()
            response = self._process(route, encoded_params, key)
        finally:
            if scope is not None:
                self.server.release(scope)
        if response is None:
            self._drop_connection()
        else:
            self._send(response)

    def _process(self, route: Route, encoded_params: str, key: str | None) -> Response | None:
        """The answer to send, or ``None`` when the response is to be lost after committing."""
        faults = self.server.faults
        if self.server.roll(faults.error_rate):
            return api_error("An injected error occurred; nothing was processed. Retry with the same key.")
        response = run_route(self.server.store, route, encoded_params, key)
        if self.command in ("POST", "DELETE") and self.server.roll(faults.lost_response_rate):
            return None
        return response

    def _sleep_latency(self) -> None:
        latency_ms = self.server.faults.latency_ms
        if latency_ms > 0:
            time.sleep(latency_ms / 1000)

    def _drop_connection(self) -> None:
        """The work is committed; the client sees the connection close with no status line."""
        self.close_connection = True
        with suppress(OSError):
            self.connection.shutdown(socket.SHUT_RDWR)

    def _send(self, response: Response) -> None:
        data = json.dumps(response.body).encode("utf-8")
        self.send_response(response.status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.send_header("Request-Id", "req_" + secrets.token_hex(8))
        for name, value in response.headers.items():
            self.send_header(name, value)
        self.end_headers()
        self.wfile.write(data)
