"""``job serve``: the status HTTP API of CONTRACT.md, on Starlette + uvicorn.

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
import os
import socket
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import uvicorn
from dagster import DagsterInstance
from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route
from starlette.types import ASGIApp, Receive, Scope, Send

from durable_assets import openapi, runner
from durable_assets.errors import BatchConflictError, InvalidBatchIdError, UnknownBatchError, UsageError
from durable_assets.events import BatchEventFeed
from durable_assets.kit.sse import event_stream, parse_last_event_id
from durable_assets.status import batch_status, list_batches

logger = logging.getLogger("durable_assets.api")

TOKEN_ENV = "DURABLE_API_TOKEN"
#: Seconds of silence before a keepalive comment on an event stream (tests set it lower).
HEARTBEAT_ENV = "DURABLE_API_HEARTBEAT_S"

Handler = Callable[[Request], Awaitable[Response] | Response]


@dataclass(frozen=True)
class Endpoint:
    path: str
    method: str
    handler: Handler
    #: The OpenAPI operation object (see durable_assets/openapi.py).
    operation: dict[str, Any]
    #: Served without the bearer token; CONTRACT.md allows this for /healthz only.
    public: bool = False


def _instance(request: Request) -> DagsterInstance:
    return request.app.state.instance  # type: ignore[no-any-return]


def _batch_id(request: Request) -> str:
    return str(request.path_params["id"])


async def healthz(_request: Request) -> Response:
    return JSONResponse({"status": "ok"})


async def list_runs(request: Request) -> Response:
    return JSONResponse(await run_in_threadpool(list_batches, _instance(request)))


async def get_run(request: Request) -> Response:
    return JSONResponse(await run_in_threadpool(batch_status, _instance(request), _batch_id(request)))


async def cancel_run(request: Request) -> Response:
    batch_id = _batch_id(request)
    result = await run_in_threadpool(runner.cancel_batch, _instance(request), batch_id)
    return JSONResponse({"id": batch_id, "result": result}, status_code=202)


async def run_events(request: Request) -> Response:
    try:
        after = parse_last_event_id(request.headers.get("last-event-id"))
    except ValueError as exc:
        raise UsageError(str(exc)) from exc
    feed = await run_in_threadpool(BatchEventFeed, _instance(request), _batch_id(request), after)
    if await run_in_threadpool(feed.nothing_left):
        # 204 is how a server tells an EventSource to stop reconnecting (HTML spec, SSE).
        return Response(status_code=204)
    state = request.app.state
    return StreamingResponse(
        event_stream(feed.poll, poll_interval_s=state.poll_interval_s, heartbeat_s=state.heartbeat_s),
        media_type="text/event-stream",
        headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
    )


async def metrics(request: Request) -> Response:
    from durable_assets.metrics import render_metrics  # prometheus_client only when scraped

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
        Endpoint("/metrics", "GET", metrics, openapi.METRICS),
        Endpoint("/openapi.json", "GET", openapi_json, openapi.OPENAPI),
    ]


# --- errors: JSON bodies, never a traceback ------------------------------------------------------


def _error(status: int, code: str, message: str, headers: dict[str, str] | None = None) -> JSONResponse:
    return JSONResponse({"error": code, "message": message}, status_code=status, headers=headers)


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


class BearerAuth:
    """Every path but the public ones needs ``Authorization: Bearer <token>`` (constant-time check)."""

    def __init__(self, app: ASGIApp, token: str, public_paths: frozenset[str]) -> None:
        self.app = app
        self.expected = token.encode()
        self.public_paths = public_paths

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"] in self.public_paths:
            await self.app(scope, receive, send)
            return
        header = next((v for k, v in scope["headers"] if k == b"authorization"), b"")
        scheme, _, given = header.partition(b" ")
        if scheme.lower() == b"bearer" and hmac.compare_digest(given.strip(), self.expected):
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
    heartbeat_s: float = 15.0,
    poll_interval_s: float = 0.25,
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
    app.state.openapi = openapi.document([(e.path, e.method, e.operation) for e in table], auth=bool(token))
    if token:
        return BearerAuth(app, token, frozenset(e.path for e in table if e.public))
    return app


def serve(instance: DagsterInstance, host: str = "127.0.0.1", port: int = 8000) -> None:
    """Serve until interrupted. Prints the address it listens on (``--port 0`` picks a free port)."""
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logger.setLevel(logging.INFO)
    token = os.environ.get(TOKEN_ENV) or None
    heartbeat_s = float(os.environ.get(HEARTBEAT_ENV) or 15.0)
    app = create_app(instance, token=token, heartbeat_s=heartbeat_s)
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        raise UsageError(
            f"cannot listen on {host}:{port}: {exc.strerror}; pick another --port (0 = any free port)"
        ) from exc
    bound = sock.getsockname()[1]
    shown = f"[{host}]" if family == socket.AF_INET6 else host
    print(
        f"job serve: listening on http://{shown}:{bound} (auth: {'bearer token' if token else 'off'})",
        flush=True,
    )
    if not token and host not in ("127.0.0.1", "localhost", "::1"):
        logger.warning(
            "serving on %s without %s: anyone who can reach it can cancel batches", host, TOKEN_ENV
        )
    config = uvicorn.Config(app, log_level="info", timeout_graceful_shutdown=2, lifespan="off")
    uvicorn.Server(config).run(sockets=[sock])
