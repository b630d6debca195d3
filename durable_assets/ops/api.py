"""``job serve``: the status HTTP API of docs/contract.md, on Starlette + uvicorn.

Thin on purpose: the status JSON is ``status.batch_status`` (the same call as ``job status
--json``), cancel is ``runner.cancel_batch`` (the same call as ``job cancel``), and the event
stream is ``events.BatchEventFeed`` over the kit's SSE loop. Starlette and uvicorn already come
with dagster-webserver, so the API adds no framework of its own.

Routes are one table (:func:`endpoints`); a module that adds a route (e.g. ``/metrics``) adds one
``Endpoint`` there and gets auth, error handling and its place in ``/openapi.json`` with it.
"""

from __future__ import annotations

import hmac
import logging
import re
import resource
import socket
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qsl, urlencode

import anyio
import uvicorn
from dagster import DagsterInstance
from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.datastructures import Headers
from starlette.exceptions import HTTPException
from starlette.middleware.cors import CORSMiddleware
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse
from starlette.routing import Route
from starlette.types import ASGIApp, Receive, Scope, Send

from durable_assets.errors import (
    BatchConflictError,
    InvalidBatchIdError,
    StorageError,
    UnknownBatchError,
    UsageError,
)
from durable_assets.ops import openapi, runner
from durable_assets.ops.events import BatchEventFeed
from durable_assets.ops.http_guard import (
    RETRY_AFTER_S,
    ConnectionLimits,
    guarded_protocol,
    over_capacity_body,
)
from durable_assets.ops.registry import durable_jobs
from durable_assets.ops.settings import ApiSettings
from durable_assets.ops.sse import SharedFeeds, event_stream, parse_last_event_id
from durable_assets.ops.status import LIST_DEFAULT_LIMIT, batch_status, check_batch_id, list_batches
from durable_assets.ops.stored_files import BatchFile, read_batch_file
from durable_assets.settings import variable

logger = logging.getLogger("durable_assets.ops.api")

#: Threads that the polls of all event streams share. Each poll is a few storage reads; four
#: threads serve ~100 streams at the 0.25 s interval on a 2-core machine, and status reads keep
#: the default pool (40 threads) to themselves whatever the number of streams.
STREAM_POLL_THREADS = 4
#: Seconds an idle keep-alive connection stays open (uvicorn's default, stated here).
KEEP_ALIVE_S = 5
#: The one route that accepts the token as ``?access_token=``: an EventSource cannot send headers.
_EVENTS_PATH = re.compile(r"^/runs/[^/]+/events$")
#: The variables named in error bodies (a client must learn which knob raises the cap).
TOKEN_ENV = variable(ApiSettings.model_fields["token"])
MAX_HEADER_BYTES_ENV = variable(ApiSettings.model_fields["max_header_bytes"])
HEADER_TIMEOUT_ENV = variable(ApiSettings.model_fields["header_timeout_s"])
MAX_CONNECTIONS_ENV = variable(ApiSettings.model_fields["max_connections"])
MAX_STREAMS_ENV = variable(ApiSettings.model_fields["max_streams"])


def _connection_limits(settings: ApiSettings) -> ConnectionLimits:
    """The HTTP guard's limits, naming the variables that raise them."""
    return ConnectionLimits(
        max_header_bytes=settings.max_header_bytes,
        header_timeout_s=settings.header_timeout_s,
        max_connections=settings.max_connections,
        max_stalled_per_client=settings.max_stalled_per_client,
        header_bytes_setting=MAX_HEADER_BYTES_ENV,
        header_timeout_setting=HEADER_TIMEOUT_ENV,
        connections_setting=MAX_CONNECTIONS_ENV,
    )


Handler = Callable[[Request], Awaitable[Response] | Response]


@dataclass(frozen=True)
class Endpoint:
    path: str
    method: str
    handler: Handler
    #: The OpenAPI operation object (see durable_assets/ops/openapi.py).
    operation: dict[str, Any]
    #: Served without the bearer token; docs/contract.md allows this for /healthz only.
    public: bool = False


def _instance(request: Request) -> DagsterInstance:
    return request.app.state.instance  # type: ignore[no-any-return]


def _batch_id(request: Request) -> str:
    return str(request.path_params["id"])


async def healthz(_request: Request) -> Response:
    return JSONResponse(openapi.HealthModel(status="ok").model_dump())


#: The largest page ``GET /runs?limit=`` serves; ``job list --all`` is the way to everything.
MAX_PAGE = 1000


class BadPageParameter(UsageError):
    """``GET /runs`` with a ``limit`` or ``before`` that cannot name a page."""


async def list_runs(request: Request) -> Response:
    job = request.query_params.get("job")
    if job is not None:
        durable_jobs().get(job)  # an unknown job is a 422 naming the registered ones, not an empty list
    limit, before = _page_params(request)
    try:
        page = await run_in_threadpool(list_batches, _instance(request), job=job, limit=limit, before=before)
    except UnknownBatchError:
        return _error(404, "unknown_batch", f"before: no batch {before!r}")
    headers = {}
    if page.has_more:  # RFC 8288: where the next page is; the body stays the contract's array
        query = urlencode(
            {k: v for k, v in (("job", job), ("limit", limit), ("before", page.batches[-1].id)) if v}
        )
        headers["Link"] = f'</runs?{query}>; rel="next"'
    return JSONResponse([b.as_json() for b in page.batches], headers=headers)


def _page_params(request: Request) -> tuple[int, str | None]:
    """``?limit=`` (1-1000, default 50) and ``?before=`` (a batch ID): a bad one is a 422 naming it."""
    raw = request.query_params.get("limit", str(LIST_DEFAULT_LIMIT))
    if not raw.isdigit() or not 1 <= int(raw) <= MAX_PAGE:
        raise BadPageParameter(f"limit must be an integer from 1 to {MAX_PAGE}, not {raw!r}")
    before = request.query_params.get("before")
    if before is not None:
        check_batch_id(before)
    return int(raw), before


async def get_run(request: Request) -> Response:
    st = await run_in_threadpool(batch_status, _instance(request), _batch_id(request))
    return JSONResponse(st.as_json())


async def get_run_file(request: Request) -> Response:
    """One of the batch's files, read by the URI its step's metadata names (any host reaches it)."""
    instance, name = _instance(request), str(request.path_params["name"])
    st = await run_in_threadpool(batch_status, instance, _batch_id(request), include_steps=False)
    found = next((f for f in st.files if f.name == name), None)
    if found is None:
        return _error(
            404,
            "unknown_file",
            f"batch {st.id!r} has no file {name!r}; its files: "
            f"{', '.join(f.name for f in st.files) or 'none'}",
        )
    file = BatchFile(found.name, found.label, found.step, found.uri)
    try:
        data = await run_in_threadpool(read_batch_file, instance, file)
    except StorageError as exc:
        return _error(404, "file_gone", str(exc))
    kind = "text/csv; charset=utf-8" if name.endswith(".csv") else "application/octet-stream"
    return Response(data, media_type=kind, headers={"Content-Disposition": f'attachment; filename="{name}"'})


async def cancel_run(request: Request) -> Response:
    batch_id = _batch_id(request)
    result = await run_in_threadpool(runner.cancel_batch, _instance(request), batch_id)
    # Validated: an answer the document does not list fails here (500), not in a client.
    body = openapi.CancelAcceptedModel.model_validate({"id": batch_id, "result": result})
    return JSONResponse(body.model_dump(), status_code=202)


class StreamSlots:
    """At most ``limit`` event streams at once; a slot is held from the request to the stream's end."""

    def __init__(self, limit: int, poll_interval_s: float) -> None:
        self.limit = limit
        self.open = 0
        #: Shared by the polls of every stream (see STREAM_POLL_THREADS).
        self.poll_threads = anyio.CapacityLimiter(STREAM_POLL_THREADS)
        #: Streams of one batch share its storage reads.
        self.feeds = SharedFeeds(min_interval_s=poll_interval_s)

    def try_take(self) -> bool:
        # The event loop is one thread: a check and an increment with no await between are atomic.
        if self.open >= self.limit:
            return False
        self.open += 1
        return True

    def give_back(self) -> None:
        self.open -= 1


class _SlotStream(StreamingResponse):
    """A stream that gives its slot back however it ends (finished, client gone, cancelled)."""

    def __init__(self, release: Callable[[], None], *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._release = release

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            self._release()


async def run_events(request: Request) -> Response:
    try:
        after = parse_last_event_id(request.headers.get("last-event-id"))
    except ValueError as exc:
        raise UsageError(str(exc)) from exc
    state = request.app.state
    slots: StreamSlots = state.streams
    if not slots.try_take():
        logger.warning("event stream refused: %d open (%s)", slots.open, MAX_STREAMS_ENV)
        return JSONResponse(
            over_capacity_body("event_streams", slots.limit, MAX_STREAMS_ENV),
            status_code=503,
            headers={"Retry-After": str(RETRY_AFTER_S)},
        )
    try:
        batch_id = _batch_id(request)
        feed = await anyio.to_thread.run_sync(
            BatchEventFeed, _instance(request), batch_id, after, limiter=slots.poll_threads
        )
        if await anyio.to_thread.run_sync(feed.nothing_left, limiter=slots.poll_threads):
            # 204 is how a server tells an EventSource to stop reconnecting (HTML spec, SSE).
            slots.give_back()
            return Response(status_code=204)
        poll, leave = slots.feeds.join(batch_id, after or 0, lambda: feed.poll)
    except BaseException:
        slots.give_back()
        raise

    def release() -> None:
        leave()
        slots.give_back()

    return _SlotStream(
        release,
        event_stream(
            poll,
            poll_interval_s=state.poll_interval_s,
            heartbeat_s=state.heartbeat_s,
            limiter=slots.poll_threads,
        ),
        media_type="text/event-stream",
        headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
    )


async def metrics(request: Request) -> Response:
    from durable_assets.ops.metrics import render_metrics  # prometheus_client only when scraped

    body = await run_in_threadpool(render_metrics, _instance(request))
    return Response(body, media_type="text/plain; version=0.0.4; charset=utf-8")


async def openapi_json(request: Request) -> Response:
    return JSONResponse(request.app.state.openapi)


def endpoints() -> list[Endpoint]:
    return [
        Endpoint("/healthz", "GET", healthz, openapi.HEALTHZ, public=True),
        Endpoint("/runs", "GET", list_runs, openapi.LIST_RUNS),
        Endpoint("/runs/{id}", "GET", get_run, openapi.GET_RUN),
        Endpoint("/runs/{id}/events", "GET", run_events, openapi.RUN_EVENTS),
        Endpoint("/runs/{id}/cancel", "POST", cancel_run, openapi.CANCEL_RUN),
        Endpoint("/runs/{id}/files/{name}", "GET", get_run_file, openapi.RUN_FILE),
        Endpoint("/metrics", "GET", metrics, openapi.METRICS),
        Endpoint("/openapi.json", "GET", openapi_json, openapi.OPENAPI),
    ]


# --- errors: JSON bodies, never a traceback ------------------------------------------------------


def _error(status: int, code: str, message: str, headers: dict[str, str] | None = None) -> JSONResponse:
    body = openapi.ErrorModel(error=code, message=message)
    return JSONResponse(body.model_dump(), status_code=status, headers=headers)


async def _durable_error(request: Request, exc: Exception) -> Response:
    if isinstance(exc, UnknownBatchError):
        return _error(404, "unknown_batch", f"no batch {request.path_params.get('id', '')!r}")
    if isinstance(exc, InvalidBatchIdError):
        return _error(422, "invalid_batch_id", str(exc))
    if isinstance(exc, UsageError):
        return _error(422, "invalid_request", str(exc))
    if isinstance(exc, BatchConflictError):
        return _error(409, "conflict", str(exc))
    return await _unexpected_error(request, exc)


async def _http_error(_request: Request, exc: Exception) -> Response:
    assert isinstance(exc, HTTPException)
    code = {404: "not_found", 405: "method_not_allowed"}.get(exc.status_code, "http_error")
    return _error(exc.status_code, code, str(exc.detail), dict(exc.headers or {}))


async def _unexpected_error(request: Request, exc: Exception) -> Response:
    logger.error("%s %s failed", request.method, request.url.path, exc_info=exc)
    return _error(500, "internal_error", "unexpected server error; the server log has the details")


# --- auth ----------------------------------------------------------------------------------------


def _take_query_token(scope: Scope) -> bytes | None:
    """``access_token`` of an event-stream request's query; removed from every request's query.

    Removed so that it reaches neither the access log (uvicorn logs the scope's query string) nor
    a handler, whatever the route. Only GET of ``/runs/{id}/events`` accepts it: that is the route
    an EventSource opens, and an EventSource cannot send an Authorization header.
    """
    if not scope["query_string"]:
        return None
    pairs = parse_qsl(scope["query_string"].decode("latin-1"), keep_blank_values=True)
    tokens = [v for k, v in pairs if k == "access_token"]
    if not tokens:
        return None
    scope["query_string"] = urlencode([(k, v) for k, v in pairs if k != "access_token"]).encode()
    if scope["method"] != "GET" or not _EVENTS_PATH.match(scope["path"]):
        return None
    return tokens[-1].encode()


class BearerAuth:
    """Every path but the public ones needs ``Authorization: Bearer <token>`` (constant-time check).

    The event stream also takes ``?access_token=<token>`` (see :func:`_take_query_token`), but not
    both: a request with an Authorization header is judged by it alone. A request with two
    Authorization headers is a 400 whatever they hold: which one a server or a proxy on the way
    reads is not defined, so one could authenticate a request the other did not mean (the
    simulator refuses them the same way).
    """

    def __init__(self, app: ASGIApp, token: str, public_paths: frozenset[str]) -> None:
        self.app = app
        self.expected = token.encode()
        self.public_paths = public_paths

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        from_query = _take_query_token(scope)
        if scope["path"] in self.public_paths:
            await self.app(scope, receive, send)
            return
        given_headers = [v for k, v in scope["headers"] if k == b"authorization"]
        if len(given_headers) > 1:
            await _error(
                400,
                "invalid_request",
                "the request has more than one Authorization header; send the token in exactly one",
            )(scope, receive, send)
            return
        header = given_headers[0] if given_headers else b""
        scheme, _, given = header.partition(b" ")
        if scheme.lower() == b"bearer" and hmac.compare_digest(given.strip(), self.expected):
            await self.app(scope, receive, send)
            return
        if not header and from_query is not None and hmac.compare_digest(from_query, self.expected):
            await self.app(scope, receive, send)
            return
        response = _error(
            401,
            "unauthorized",
            f"send `Authorization: Bearer <token>` with the token in {TOKEN_ENV}",
            {"WWW-Authenticate": 'Bearer realm="durable-assets"'},
        )
        await response(scope, receive, send)


# --- the app -------------------------------------------------------------------------------------


def create_app(
    instance: DagsterInstance,
    *,
    token: str | None = None,
    heartbeat_s: float = ApiSettings.model_fields["heartbeat_s"].default,
    poll_interval_s: float = 0.25,
    max_streams: int = ApiSettings.model_fields["max_streams"].default,
    cors_origins: Sequence[str] = (),
    extra: list[Endpoint] | None = None,
) -> ASGIApp:
    table = endpoints() + list(extra or [])
    app = Starlette(
        routes=[Route(e.path, e.handler, methods=[e.method]) for e in table],
        exception_handlers={
            UsageError: _durable_error,
            BatchConflictError: _durable_error,
            HTTPException: _http_error,
            Exception: _unexpected_error,
        },
    )
    app.state.instance = instance
    app.state.heartbeat_s = heartbeat_s
    app.state.poll_interval_s = poll_interval_s
    app.state.streams = StreamSlots(max_streams, poll_interval_s)
    app.state.openapi = openapi.document(
        [(e.path, e.method, e.operation) for e in table],
        auth=bool(token),
        always_served=frozenset(e.path for e in table if e.public),
        job_names=durable_jobs().names,
    )
    served: ASGIApp = app
    if token:
        served = BearerAuth(served, token, frozenset(e.path for e in table if e.public))
    if cors_origins:
        # Outside the auth: a preflight (OPTIONS) carries no token by design (Fetch standard), and
        # a 401 must carry the CORS headers too, or the dashboard cannot even see why it failed.
        served = _OriginCheckedCORS(
            served,
            allow_origins=list(cors_origins),
            allow_methods=["GET", "POST"],
            allow_headers=["Authorization", "Last-Event-ID", "Content-Type"],
            allow_credentials=False,  # bearer tokens, never cookies
            max_age=600,
        )
    return served


class _OriginCheckedCORS(CORSMiddleware):
    """Starlette's CORS, except that a preflight from an origin not allowed gets no
    ``Access-Control-*`` header at all.

    Starlette refuses such a preflight with a 400 that still lists the allowed methods, headers and
    max-age: the API's policy, told to any page that asks. A refusal should say nothing.
    """

    def preflight_response(self, request_headers: Headers) -> Response:
        if self.is_allowed_origin(origin=request_headers["origin"]):
            return super().preflight_response(request_headers)
        # Vary as for an allowed one: a cache must not serve this refusal to an allowed origin.
        vary = {name: value for name, value in self.preflight_headers.items() if name.lower() == "vary"}
        return PlainTextResponse("Disallowed CORS origin", status_code=400, headers=vary)


def _raise_fd_limit(needed: int) -> None:
    """Make room for the connection caps in the process's file-descriptor limit, or say it cannot."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY or soft >= needed:
        return
    target = needed if hard == resource.RLIM_INFINITY else min(needed, hard)
    resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
    if target < needed:
        logger.warning(
            "file-descriptor limit %d is below the %d the caps need; lower %s",
            target,
            needed,
            MAX_CONNECTIONS_ENV,
        )


def serve(
    instance: DagsterInstance,
    host: str = "127.0.0.1",
    port: int = 8000,
    settings: ApiSettings | None = None,
) -> None:
    """Serve until interrupted. Prints the address it listens on (``--port 0`` picks a free port)."""
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logger.setLevel(logging.INFO)
    settings = settings or ApiSettings.from_env()
    token = settings.token
    app = create_app(
        instance,
        token=token,
        heartbeat_s=settings.heartbeat_s,
        max_streams=settings.max_streams,
        cors_origins=settings.cors_origins,
    )
    # Caps + overflow + the instance's own files and sockets.
    _raise_fd_limit(2 * settings.max_connections + 256)
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
        # Listening before the line below is printed: a client that reads it and connects at once
        # waits in the backlog for uvicorn instead of being refused.
        sock.listen(2048)
    except OSError as exc:
        sock.close()
        raise UsageError(
            f"cannot listen on {host}:{port}: {exc.strerror}; pick another --port (0 = any free port)"
        ) from exc
    bound = sock.getsockname()[1]
    shown = f"[{host}]" if family == socket.AF_INET6 else host
    print(
        f"job serve: listening on http://{shown}:{bound} (auth: {'bearer token' if token else 'off'}; "
        f"cors: {', '.join(settings.cors_origins) or 'off'})",
        flush=True,
    )
    if not token and host not in ("127.0.0.1", "localhost", "::1"):
        logger.warning(
            "serving on %s without %s: anyone who can reach it can cancel batches", host, TOKEN_ENV
        )
    limits = _connection_limits(settings)
    config = uvicorn.Config(
        app,
        log_level="info",
        timeout_graceful_shutdown=2,
        lifespan="off",
        # h11, not httptools: h11 bounds what it buffers, and the guard (ops/http_guard.py) is a
        # subclass of uvicorn's h11 protocol that adds the header size, header time and
        # connection caps that neither enforces.
        http=guarded_protocol(limits),  # type: ignore[arg-type]
        h11_max_incomplete_event_size=limits.h11_max_incomplete_event_size,
        timeout_keep_alive=KEEP_ALIVE_S,
    )
    uvicorn.Server(config).run(sockets=[sock])
