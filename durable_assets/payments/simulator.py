"""A Stripe-compatible HTTP payment simulator (``job provider serve``) with fault injection.

It speaks the subset of Stripe's v1 API the refund pipeline uses, closely enough that the
official ``stripe`` SDK talks to it unmodified, and it can misbehave on purpose: latency,
injected 500s, lost responses (the refund is committed but the client never hears back) and
rate limiting. Those are exactly the faults that turn naive retries into double refunds, so the
pipeline's exactly-once claims are tested against them rather than against a polite server.

All business rules live in :class:`PaymentStore`; this module only translates HTTP.

Routes (everything under ``/v1`` needs an API key the simulator accepts, sent as Stripe takes it:
``Authorization: Bearer KEY`` or HTTP Basic with the key as user, ``curl -u KEY:``; the keys given
with ``--api-key``, else any ``sk_test_`` key):

* ``POST /v1/charges``, ``POST /v1/refunds`` (form-encoded like Stripe, ``Idempotency-Key``)
* ``GET /v1/refunds/{id}``, ``GET /v1/refunds?limit=&starting_after=&ending_before=&charge=``
* ``GET /v1/charges/{id}`` and ``GET /v1/charges/{id}/refunds`` (the URL of a charge's refund list)
* ``POST /v1/customers`` (``email``, ``name``, ``metadata[...]``, ``Idempotency-Key``),
  ``GET /v1/customers/{id}``, ``GET /v1/customers?limit=&starting_after=&ending_before=&email=``
* ``DELETE /v1/customers/{id}`` (Stripe's semantics: the id then answers ``deleted: true``, lists
  leave it out, writes on it and a second delete are 404)
* ``POST /v1/customers/{id}/balance_transactions`` (``amount``, ``currency``, ``description``,
  ``metadata[...]``, ``Idempotency-Key``), ``GET /v1/customers/{id}/balance_transactions`` and
  ``GET /v1/customers/{id}/balance_transactions/{txn}``
* ``GET /v1/account``: the account this ``--db`` file is, its id made once with the file
* ``expand[]`` on all of them (``expand[]=charge`` on a refund, ``expand[]=customer`` on a balance
  transaction, ``expand[]=data.charge`` on a list); expansion is applied to the answer, so an
  idempotent replay is expanded afresh
* ``GET /_sim/stats`` and ``GET /healthz`` (no auth, no faults)

Every fault applies to every ``/v1`` route alike; a lost response drops the answer of any POST or
DELETE after its work is committed.

Order of checks for a ``/v1`` request: counted in ``requests``, route (404), auth (400 for two
``Authorization`` headers, 401), refund request counted in ``refund_requests``, rate limit (429),
in-flight idempotency key (409), latency, injected error (500), processing, lost response. 401 and
429 answers are immediate: a real edge rejects them before any work. Unauthenticated requests are
not counted in ``refund_requests``.

``requests`` (in ``/_sim/stats``) is every ``/v1`` request this process received, whatever its
answer. Unlike the other counters it is kept in memory, not in the ``--db`` file, so it restarts at
0 with the process: it counts traffic, not effects, and persisting it would cost a synced write
(~2 ms measured) on every request, reads included, which would make the simulator the bottleneck.

``Retry-After`` on 429 is a whole number of seconds, rounded up and at least 1, because RFC 9110
allows only integers there and strict clients reject anything else; rounding up keeps the promise
that a token is back in the bucket by then (unless another client takes it first).
"""

from __future__ import annotations

import base64
import binascii
import json
import logging
import math
import random
import re
import secrets
import socket
import socketserver
import sys
import threading
import time
from collections.abc import Callable, Iterable
from contextlib import suppress
from dataclasses import dataclass, field, replace
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qsl, unquote

from durable_assets.errors import UsageError
from durable_assets.payments.store import (
    JsonObject,
    PaymentStore,
    StoreResult,
    StripeApiError,
    invalid_request,
)

log = logging.getLogger(__name__)


class _ClientGone(Exception):
    """The client closed the connection before its request was complete."""


_MAX_BODY_BYTES = 1 << 20
_IDLE_KEEPALIVE_S = 60.0
_DRAIN_TIMEOUT_S = 5.0
_NESTED = re.compile(r"^([A-Za-z_]+)\[(.*)\]$")
_INTEGER = re.compile(r"^-?[0-9]+$")
#: Accepted when no ``--api-key`` is given: any test-mode secret key, like the one in Stripe's docs.
TEST_KEY_PREFIX = "sk_test_"
_KEY_PREFIXES = tuple(f"{kind}_{mode}_" for kind in ("sk", "rk", "pk") for mode in ("test", "live"))


# --- configuration -------------------------------------------------------------------------------


@dataclass(frozen=True)
class Faults:
    """The misbehaviour the simulator injects; replaceable at runtime via ``configure``."""

    latency_ms: float = 0.0
    error_rate: float = 0.0
    lost_response_rate: float = 0.0
    rate_limit: float | None = None

    def __post_init__(self) -> None:
        if self.latency_ms < 0:
            raise UsageError(f"--latency-ms must be >= 0, got {self.latency_ms}.")
        for name in ("error_rate", "lost_response_rate"):
            rate = getattr(self, name)
            if not 0.0 <= rate <= 1.0:
                raise UsageError(f"--{name.replace('_', '-')} must be between 0 and 1, got {rate}.")
        if self.rate_limit is not None and self.rate_limit <= 0:
            raise UsageError(f"--rate-limit must be > 0 requests/s, got {self.rate_limit}.")


@dataclass(frozen=True)
class ApiKeys:
    """Which API keys the simulator accepts: the ``--api-key`` values, or any ``sk_test_`` key.

    Stripe answers 401 for a key it does not know; accepting anything would let a client whose
    ``STRIPE_API_KEY`` is wrong pass every test here and fail on its first call to Stripe.
    """

    keys: frozenset[str] = frozenset()

    @classmethod
    def of(cls, keys: Iterable[str]) -> ApiKeys:
        accepted = frozenset(keys)
        for key in accepted:
            if not key or any(character.isspace() or character == ":" for character in key):
                raise UsageError(f"--api-key must be non-empty, without spaces or ':', got {key!r}.")
        return cls(accepted)

    def accepts(self, key: str) -> bool:
        if self.keys:
            return key in self.keys
        return key.startswith(TEST_KEY_PREFIX) and len(key) > len(TEST_KEY_PREFIX)


class TokenBucket:
    """Admits ``rate`` requests/s on average, with a burst of one second's worth (at least one)."""

    def __init__(self, rate: float, clock: Callable[[], float] = time.monotonic) -> None:
        self._rate = rate
        self._capacity = max(1.0, rate)
        self._tokens = self._capacity
        self._clock = clock
        self._updated = clock()
        self._lock = threading.Lock()

    def take(self) -> float | None:
        """``None`` if admitted, else the seconds until a token will be available."""
        with self._lock:
            now = self._clock()
            self._tokens = min(self._capacity, self._tokens + (now - self._updated) * self._rate)
            self._updated = now
            if self._tokens >= 1.0:
                self._tokens -= 1.0
                return None
            return (1.0 - self._tokens) / self._rate


def format_retry_after(seconds: float) -> str:
    """Whole seconds rounded up (RFC 9110 delta-seconds): ``0.05`` -> ``1``, ``2.0`` -> ``2``; never 0."""
    return str(max(1, math.ceil(seconds)))


# --- server --------------------------------------------------------------------------------------


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
    ) -> None:
        self.store = store
        self.api_keys = api_keys or ApiKeys()
        self._faults = faults
        self._bucket = _bucket_for(faults)
        self._rng = random.Random(seed)
        self._lock = threading.Lock()
        self._in_flight: set[tuple[str, str]] = set()
        self._requests = 0
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
        return None if bucket is None else bucket.take()

    def received(self) -> None:
        """Counts one ``/v1`` request, before anything can reject it."""
        with self._lock:
            self._requests += 1

    def stats(self) -> dict[str, int]:
        """The store's counters plus this process's ``requests``."""
        with self._lock:
            requests = self._requests
        return {**self.store.stats(), "requests": requests}

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
    *,
    latency_ms: float = 0,
    error_rate: float = 0.0,
    lost_response_rate: float = 0.0,
    rate_limit: float | None = None,
    seed: int | None = None,
    api_keys: Iterable[str] = (),
) -> SimulatorServer:
    """Binds (``port=0`` picks a free port; read it from ``server.port``) without serving yet.

    Run it with ``server.serve_forever()`` (in a thread for tests), stop it with
    ``server.shutdown()`` then ``server.server_close()``. ``api_keys`` empty: any ``sk_test_`` key.
    """
    keys = ApiKeys.of(api_keys)
    faults = Faults(
        latency_ms=latency_ms,
        error_rate=error_rate,
        lost_response_rate=lost_response_rate,
        rate_limit=rate_limit,
    )
    store = PaymentStore(db_path)
    try:
        return SimulatorServer((host, port), store, faults, seed, keys)
    except BaseException:
        store.close()
        raise


def serve(
    host: str,
    port: int,
    db_path: str,
    *,
    latency_ms: float = 0,
    error_rate: float = 0.0,
    lost_response_rate: float = 0.0,
    rate_limit: float | None = None,
    seed: int | None = None,
    api_keys: Iterable[str] = (),
) -> None:
    """Serves until interrupted; one line on stderr says where, nothing per request."""
    server = build_server(
        host,
        port,
        db_path,
        latency_ms=latency_ms,
        error_rate=error_rate,
        lost_response_rate=lost_response_rate,
        rate_limit=rate_limit,
        seed=seed,
        api_keys=api_keys,
    )
    print(f"payment simulator listening on {server.url} (db: {db_path})", file=sys.stderr, flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()


# --- request handling ----------------------------------------------------------------------------


@dataclass(frozen=True)
class _Response:
    status: int
    body: JsonObject
    headers: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class _Params:
    """Form or query parameters as the stripe SDK encodes them (``metadata[k]=v``)."""

    values: dict[str, str]
    metadata: dict[str, str] | None
    expand: tuple[str, ...] = ()


@dataclass(frozen=True)
class _Route:
    name: str
    handler: Callable[[PaymentStore, _Params, str | None, str], StoreResult | JsonObject]
    path_id: str = ""
    counts_refund_request: bool = False


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
        self.server.track(self.connection)

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
                self._send(_api_error("An unexpected error occurred in the simulator."))

    def _handle(self) -> None:
        path, _, query = self.path.partition("?")
        if path == "/v1" or path.startswith("/v1/"):
            self.server.received()
        try:
            body = self._read_body()
        except _ClientGone:
            self.close_connection = True
            return
        except StripeApiError as error:
            self.close_connection = True
            self._send(_error_response(error))
            return
        if path == "/healthz":
            self._send(_Response(200, {"status": "ok"}))
        elif path == "/_sim/stats" and self.command == "GET":
            self._send(_Response(200, dict(self.server.stats())))
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
        route = _match_route(self.command, path)
        if route is None:
            self._send(_unrecognized(self.command, path))
        elif (rejection := self._authenticate()) is not None:
            self._send(rejection)
        else:
            if route.counts_refund_request:  # received, even if a fault answers it below
                self.server.store.record_refund_request()
            if (wait := self.server.admit()) is not None:
                self._send(_rate_limited(wait))
            else:
                self._handle_admitted(route, encoded_params)

    def _authenticate(self) -> _Response | None:
        """``None`` when the request carries an accepted key, else Stripe's 400 or 401 for its case.

        Two ``Authorization`` headers are refused outright: which one a server or a proxy on the
        way reads is not defined, so one could authenticate a request the other did not mean.
        """
        if len(self.headers.get_all("Authorization") or []) > 1:
            return _error_response(
                invalid_request(
                    "The request has more than one Authorization header; send your API key in exactly one."
                )
            )
        key = api_key_from(self.headers.get("Authorization"))
        if not key:
            return _unauthorized(_MISSING_KEY)
        if not self.server.api_keys.accepts(key):
            return _unauthorized(f"Invalid API Key provided: {mask_api_key(key)}")
        return None

    def _handle_admitted(self, route: _Route, encoded_params: str) -> None:
        """Holds the key's in-flight mark across latency and processing, as Stripe does.

        The mark is released before the answer is written: once committed, the stored result
        answers retries, and a client that got its answer must never see its own key as busy.
        """
        key = self.headers.get("Idempotency-Key") if self.command == "POST" else None
        scope = (route.name, key) if key else None
        if scope is not None and not self.server.claim(scope):
            self._sleep_latency()
            self._send(_key_in_use(scope[1]))
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

    def _process(self, route: _Route, encoded_params: str, key: str | None) -> _Response | None:
        """The answer to send, or ``None`` when the response is to be lost after committing."""
        faults = self.server.faults
        if self.server.roll(faults.error_rate):
            return _api_error("An injected error occurred; nothing was processed. Retry with the same key.")
        response = _run_route(self.server.store, route, encoded_params, key)
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

    def _send(self, response: _Response) -> None:
        data = json.dumps(response.body).encode("utf-8")
        self.send_response(response.status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.send_header("Request-Id", "req_" + secrets.token_hex(8))
        for name, value in response.headers.items():
            self.send_header(name, value)
        self.end_headers()
        self.wfile.write(data)


# --- routes --------------------------------------------------------------------------------------


def _match_route(method: str, path: str) -> _Route | None:
    if method == "GET" and path == "/v1/account":
        return _Route("account", _retrieve_account)
    if method == "POST" and path == "/v1/charges":
        return _Route("charges", _create_charge)
    if method == "POST" and path == "/v1/refunds":
        return _Route("refunds", _create_refund, counts_refund_request=True)
    if method == "GET" and path == "/v1/refunds":
        return _Route("refunds.list", _list_refunds)
    prefix = "/v1/refunds/"
    if method == "GET" and path.startswith(prefix) and "/" not in path[len(prefix) :]:
        return _Route("refunds.retrieve", _retrieve_refund, path_id=unquote(path[len(prefix) :]))
    prefix = "/v1/charges/"
    if method == "GET" and path.startswith(prefix):
        charge_id, slash, rest = path[len(prefix) :].partition("/")
        if charge_id and not slash:
            return _Route("charges.retrieve", _retrieve_charge, path_id=unquote(charge_id))
        if charge_id and rest == "refunds":  # the URL of a charge's embedded refund list
            return _Route("charges.refunds", _list_charge_refunds, path_id=unquote(charge_id))
    return _match_customer_route(method, path)


def _match_customer_route(method: str, path: str) -> _Route | None:
    if path == "/v1/customers":
        if method == "POST":
            return _Route("customers", _create_customer)
        if method == "GET":
            return _Route("customers.list", _list_customers)
        return None
    prefix = "/v1/customers/"
    if not path.startswith(prefix):
        return None
    customer_id, slash, rest = path[len(prefix) :].partition("/")
    customer_id = unquote(customer_id)
    if not customer_id:
        return None
    if method == "GET" and not slash:
        return _Route("customers.retrieve", _retrieve_customer, path_id=customer_id)
    if method == "DELETE" and not slash:
        return _Route("customers.delete", _delete_customer, path_id=customer_id)
    transactions = "balance_transactions/"
    if method == "GET" and rest.startswith(transactions) and "/" not in rest[len(transactions) :]:
        transaction_id = unquote(rest[len(transactions) :])
        if transaction_id:
            return _Route(
                "customers.balance_transactions.retrieve",
                _retrieve_balance_transaction,
                path_id=f"{customer_id}/{transaction_id}",
            )
    if rest == "balance_transactions" and method == "POST":
        return _Route("customers.balance_transactions", _create_balance_transaction, path_id=customer_id)
    if rest == "balance_transactions" and method == "GET":
        return _Route("customers.balance_transactions.list", _list_balance_transactions, path_id=customer_id)
    return None


def _run_route(store: PaymentStore, route: _Route, encoded_params: str, key: str | None) -> _Response:
    try:
        params = _parse_params(encoded_params)
        result = route.handler(store, params, key, route.path_id)
    except StripeApiError as error:
        return _error_response(error, key)
    if isinstance(result, StoreResult):
        return _Response(200, result.body, _success_headers(key, result.replayed))
    return _Response(200, result)


def _create_charge(store: PaymentStore, params: _Params, key: str | None, _: str) -> StoreResult:
    _reject_unknown(params, {"amount", "currency", "customer", "description", "source"})
    _check_expand("charge", params.expand)
    result = store.create_charge_result(
        amount=_required_int(params, "amount"),
        currency=_required_str(params, "currency"),
        customer=params.values.get("customer"),
        description=params.values.get("description"),
        metadata=params.metadata,
        idempotency_key=key,
    )
    return replace(result, body=_expanded(store, result.body, params.expand))


def _create_refund(store: PaymentStore, params: _Params, key: str | None, _: str) -> StoreResult:
    _reject_unknown(params, {"charge", "amount", "reason"})
    _check_expand("refund", params.expand)  # before anything is committed, as at Stripe
    result = store.create_refund_result(
        charge=_required_str(params, "charge"),
        amount=_optional_int(params, "amount"),
        reason=params.values.get("reason") or None,
        metadata=params.metadata,
        idempotency_key=key,
    )
    return replace(result, body=_expanded(store, result.body, params.expand))


def _retrieve_refund(store: PaymentStore, params: _Params, _key: str | None, refund_id: str) -> JsonObject:
    _reject_unknown(params, set(), allow_metadata=False)
    _check_expand("refund", params.expand)
    return _expanded(store, store.retrieve_refund(refund_id), params.expand)


def _retrieve_charge(store: PaymentStore, params: _Params, _key: str | None, charge_id: str) -> JsonObject:
    _reject_unknown(params, set(), allow_metadata=False)
    _check_expand("charge", params.expand)
    return _expanded(store, store.retrieve_charge(charge_id), params.expand)


def _list_refunds(store: PaymentStore, params: _Params, _key: str | None, _: str) -> JsonObject:
    _reject_unknown(params, {"limit", "starting_after", "ending_before", "charge"}, allow_metadata=False)
    return _refund_page(store, params, params.values.get("charge") or None)


def _list_charge_refunds(store: PaymentStore, params: _Params, _key: str | None, charge: str) -> JsonObject:
    _reject_unknown(params, {"limit", "starting_after", "ending_before"}, allow_metadata=False)
    return {**_refund_page(store, params, charge), "url": f"/v1/charges/{charge}/refunds"}


def _refund_page(store: PaymentStore, params: _Params, charge: str | None) -> JsonObject:
    _check_list_expand("refund", params.expand)
    page = store.list_refunds(**_page_params(params), charge=charge)
    return _expanded(store, page, params.expand)


def _page_params(params: _Params) -> dict[str, Any]:
    """``limit``, ``starting_after`` and ``ending_before`` as every list route takes them."""
    limit = _optional_int(params, "limit")
    return {
        "limit": 10 if limit is None else limit,
        "starting_after": params.values.get("starting_after") or None,
        "ending_before": params.values.get("ending_before") or None,
    }


def _create_customer(store: PaymentStore, params: _Params, key: str | None, _: str) -> StoreResult:
    _reject_unknown(params, {"email", "name"})
    _check_expand("customer", params.expand)
    result = store.create_customer(
        email=params.values.get("email") or None,
        name=params.values.get("name") or None,
        metadata=params.metadata,
        idempotency_key=key,
    )
    return replace(result, body=_expanded(store, result.body, params.expand))


def _retrieve_customer(store: PaymentStore, params: _Params, _key: str | None, customer: str) -> JsonObject:
    _reject_unknown(params, set(), allow_metadata=False)
    _check_expand("customer", params.expand)
    return _expanded(store, store.retrieve_customer(customer), params.expand)


def _delete_customer(store: PaymentStore, params: _Params, _key: str | None, customer: str) -> JsonObject:
    _reject_unknown(params, set(), allow_metadata=False)
    _check_expand("deleted_customer", params.expand)
    return store.delete_customer(customer)


def _retrieve_account(store: PaymentStore, params: _Params, _key: str | None, _: str) -> JsonObject:
    _reject_unknown(params, set(), allow_metadata=False)
    _check_expand("account", params.expand)
    return store.account()


def _retrieve_balance_transaction(
    store: PaymentStore, params: _Params, _key: str | None, path_id: str
) -> JsonObject:
    """``path_id`` is ``customer/transaction``: both ids come from the path (neither holds a ``/``)."""
    _reject_unknown(params, set(), allow_metadata=False)
    _check_expand("customer_balance_transaction", params.expand)
    customer, _, transaction = path_id.partition("/")
    return _expanded(store, store.retrieve_balance_transaction(customer, transaction), params.expand)


def _list_customers(store: PaymentStore, params: _Params, _key: str | None, _: str) -> JsonObject:
    _reject_unknown(params, {"limit", "starting_after", "ending_before", "email"}, allow_metadata=False)
    _check_list_expand("customer", params.expand)
    page = store.list_customers(**_page_params(params), email=params.values.get("email") or None)
    return _expanded(store, page, params.expand)


def _create_balance_transaction(
    store: PaymentStore, params: _Params, key: str | None, customer: str
) -> StoreResult:
    _reject_unknown(params, {"amount", "currency", "description"})
    _check_expand("customer_balance_transaction", params.expand)
    result = store.create_balance_transaction(
        customer,
        amount=_required_int(params, "amount"),
        currency=_required_str(params, "currency"),
        description=params.values.get("description") or None,
        metadata=params.metadata,
        idempotency_key=key,
    )
    return replace(result, body=_expanded(store, result.body, params.expand))


def _list_balance_transactions(
    store: PaymentStore, params: _Params, _key: str | None, customer: str
) -> JsonObject:
    _reject_unknown(params, {"limit", "starting_after", "ending_before"}, allow_metadata=False)
    _check_list_expand("customer_balance_transaction", params.expand)
    page = store.list_balance_transactions(customer, **_page_params(params))
    return _expanded(store, page, params.expand)


# --- expansion -----------------------------------------------------------------------------------
# Stripe's ``expand[]``: a field holding an ID is replaced by the object it names, on request.
# For each object, the fields Stripe lets a client expand, and what the simulator serves there:
# an object kind it retrieves ("charge", "customer"), None (always null or already embedded here,
# so expanding it changes nothing, as at Stripe), or a reason it cannot (the simulator has no such
# objects; a silent ID would break the client).

_RETRIEVE: dict[str, Callable[[PaymentStore, str], JsonObject]] = {
    "charge": PaymentStore.retrieve_charge,
    "customer": PaymentStore.retrieve_customer,
}

_CANNOT_EXPAND = "the simulator serves no {field} objects"
_EXPANDABLE: dict[str, dict[str, str | None]] = {
    "refund": {
        "charge": "charge",
        "balance_transaction": None,
        "failure_balance_transaction": None,
        "payment_intent": None,
        "source_transfer_reversal": None,
        "transfer_reversal": None,
    },
    "charge": {
        "refunds": None,  # the list is always embedded
        "customer": _CANNOT_EXPAND,
        "application": None,
        "application_fee": None,
        "balance_transaction": None,
        "failure_balance_transaction": None,
        "on_behalf_of": None,
        "payment_intent": None,
        "review": None,
        "source_transfer": None,
        "transfer": None,
    },
    "customer": {
        "address": None,
        "default_source": None,
        "discount": None,
        "invoice_settings": None,
        "shipping": None,
        "test_clock": None,
        # included only when expanded, and the simulator has none of them to include
        "sources": _CANNOT_EXPAND,
        "subscriptions": _CANNOT_EXPAND,
        "tax": _CANNOT_EXPAND,
        "tax_ids": _CANNOT_EXPAND,
    },
    "customer_balance_transaction": {
        "customer": "customer",
        "credit_note": None,
        "invoice": None,
    },
    # nothing in either is an expandable ID the simulator serves
    "account": {},
    "deleted_customer": {},
}


def _check_expand(kind: str, paths: tuple[str, ...]) -> None:
    """Rejects, before any work, a path Stripe would reject or the simulator cannot honour."""
    for path in paths:
        _check_expand_path(kind, path.split("."), path)


def _check_list_expand(items: str, paths: tuple[str, ...]) -> None:
    """A list's paths start with ``data.``, then continue in its items (of kind ``items``)."""
    for path in paths:
        fields = path.split(".")
        if fields[0] != "data" or len(fields) < 2:
            raise _cannot_expand(path, fields[0])
        _check_expand_path(items, fields[1:], path)


def _check_expand_path(kind: str, fields: list[str], path: str) -> None:
    field, rest = fields[0], fields[1:]
    expandable = _EXPANDABLE[kind]
    if field not in expandable:
        raise _cannot_expand(path, field)
    target = expandable[field]
    if target in _RETRIEVE and rest:
        _check_expand_path(target, rest, path)
    elif target is not None and target not in _RETRIEVE:
        raise invalid_request(
            f"The payment simulator cannot expand {path}: {target.format(field=field)}.", param="expand"
        )


def _cannot_expand(path: str, field: str) -> StripeApiError:
    where = "" if path == field else f" in {path}"
    return invalid_request(f"This property cannot be expanded ({field}){where}.", param="expand")


def _expanded(store: PaymentStore, body: JsonObject, paths: tuple[str, ...]) -> JsonObject:
    """A copy of ``body`` with the (already checked) paths expanded."""
    for path in paths:
        body = _expand_path(store, body, path.split("."))
    return body


def _expand_path(store: PaymentStore, body: JsonObject, fields: list[str]) -> JsonObject:
    if body.get("object") == "list":
        return {**body, "data": [_expand_path(store, item, fields[1:]) for item in body["data"]]}
    field, rest = fields[0], fields[1:]
    value = body.get(field)
    target = _EXPANDABLE[str(body["object"])].get(field)
    if isinstance(value, str) and target in _RETRIEVE:
        value = _RETRIEVE[target](store, value)
    if rest and isinstance(value, dict):
        value = _expand_path(store, value, rest)
    return body if value is body.get(field) else {**body, field: value}


# --- parameter parsing ---------------------------------------------------------------------------


def _parse_params(encoded: str) -> _Params:
    """Decodes Stripe's bracket notation; only ``metadata`` may be nested in this API subset."""
    values: dict[str, str] = {}
    metadata: dict[str, str] | None = None
    expand: list[str] = []
    for name, value in parse_qsl(encoded, keep_blank_values=True):
        nested = _NESTED.match(name)
        if nested and nested.group(1) == "expand" and (nested.group(2) == "" or nested.group(2).isdigit()):
            expand.append(value)  # curl's expand[]=x and the SDK's expand[0]=x
        elif nested and nested.group(1) == "metadata":
            metadata = {**(metadata or {}), nested.group(2): value}
        elif name == "metadata" and value == "":
            metadata = metadata or {}
        elif nested or name == "metadata":
            raise _unknown_parameter(nested.group(1) if nested else name)
        else:
            values[name] = value
    return _Params(values, metadata, tuple(dict.fromkeys(path for path in expand if path)))


def _reject_unknown(params: _Params, allowed: set[str], *, allow_metadata: bool = True) -> None:
    for name in params.values:
        if name not in allowed:
            raise _unknown_parameter(name)
    if params.metadata is not None and not allow_metadata:
        raise _unknown_parameter("metadata")


def _unknown_parameter(name: str) -> StripeApiError:
    return invalid_request(f"Received unknown parameter: {name}", code="parameter_unknown", param=name)


def _required_str(params: _Params, name: str) -> str:
    value = params.values.get(name)
    if not value:
        raise invalid_request(f"Missing required param: {name}.", code="parameter_missing", param=name)
    return value


def _required_int(params: _Params, name: str) -> int:
    value = _optional_int(params, name)
    if value is None:
        raise invalid_request(f"Missing required param: {name}.", code="parameter_missing", param=name)
    return value


def _optional_int(params: _Params, name: str) -> int | None:
    value = params.values.get(name)
    if value is None or value == "":
        return None
    if not _INTEGER.match(value) or len(value) > 18:
        raise invalid_request(f"Invalid integer: {value}", code="parameter_invalid_integer", param=name)
    return int(value)


def api_key_from(header: str | None) -> str:
    """The key of ``Bearer KEY``, or of HTTP Basic with the key as user (``curl -u KEY:``); else ``""``."""
    scheme, _, credentials = (header or "").strip().partition(" ")
    credentials = credentials.strip()
    if scheme.lower() == "bearer":
        return credentials
    if scheme.lower() == "basic":
        try:
            decoded = base64.b64decode(credentials, validate=True).decode("utf-8")
        except (binascii.Error, UnicodeDecodeError):
            return ""
        return decoded.partition(":")[0]
    return ""


def mask_api_key(key: str) -> str:
    """Stripe's way of naming a wrong key: the mode prefix and the last four characters only."""
    prefix = next((prefix for prefix in _KEY_PREFIXES if key.startswith(prefix)), "")
    rest = key[len(prefix) :]
    return prefix + "*" * max(len(rest) - 4, 0) + rest[-4:]


# --- responses -----------------------------------------------------------------------------------


def _success_headers(key: str | None, replayed: bool) -> dict[str, str]:
    headers = {} if key is None else {"Idempotency-Key": key}
    if replayed:
        headers["Idempotent-Replayed"] = "true"
    return headers


def _error_response(error: StripeApiError, key: str | None = None) -> _Response:
    headers = _success_headers(key, error.replayed)
    headers["Stripe-Should-Retry"] = "true" if error.http_status >= 500 else "false"
    return _Response(error.http_status, error.to_body(), headers)


def _api_error(message: str) -> _Response:
    return _Response(
        500, {"error": {"type": "api_error", "message": message}}, {"Stripe-Should-Retry": "true"}
    )


def _unrecognized(method: str, path: str) -> _Response:
    message = f"Unrecognized request URL ({method}: {path})."
    return _Response(404, {"error": {"type": "invalid_request_error", "message": message}})


_MISSING_KEY = (
    "You did not provide an API key. You need to provide your API key in the Authorization header, "
    "using Bearer auth (e.g. 'Authorization: Bearer YOUR_SECRET_KEY'). See "
    "https://stripe.com/docs/api#authentication for details, or we can help at https://support.stripe.com/."
)


def _unauthorized(message: str) -> _Response:
    """Stripe's 401: an ``invalid_request_error`` without code, and a Basic challenge."""
    return _Response(
        401,
        {"error": {"type": "invalid_request_error", "message": message}},
        {"WWW-Authenticate": 'Basic realm="Stripe"', "Stripe-Should-Retry": "false"},
    )


def _rate_limited(wait_s: float) -> _Response:
    body = {
        "error": {
            "type": "invalid_request_error",
            "code": "rate_limit",
            "message": "Too many requests hit the API too quickly. Retry after the Retry-After delay.",
        }
    }
    return _Response(429, body, {"Retry-After": format_retry_after(wait_s), "Stripe-Should-Retry": "true"})


def _key_in_use(key: str) -> _Response:
    message = (
        "There is currently another in-progress request using this Idempotency-Key (that probably means "
        f"you submitted twice, and the other request is still going through): '{key}'. "
        "Please try again later."
    )
    body = {"error": {"type": "idempotency_error", "code": "idempotency_key_in_use", "message": message}}
    return _Response(409, body, {"Stripe-Should-Retry": "true", "Idempotency-Key": key})
