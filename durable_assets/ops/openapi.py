"""The OpenAPI 3.1 description of ``job serve``: generated schemas, and one operation object per route.

Why the schemas are generated: the status JSON is a contract (docs/contract.md), and a second,
hand-kept description of it drifts from the code that writes it. The component schemas are now the
JSON Schema of the pydantic models that produce the bodies (ops/status_model.py for the status JSON
and the event stream's payloads, the small models below for the API's own answers), so a field
added to a model is documented by being added. What stays written out here is per route: its
summary, parameters and the answers it gives, which are facts about the handlers, not the data.
The fuzzing test (tests/api/test_fuzz.py) checks the running server against the whole document and
fails on any answer it does not describe.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, Field
from pydantic.json_schema import models_json_schema

from durable_assets.ops.runlog import RUN_STRIDE
from durable_assets.ops.status_model import (
    BATCH_ID_REGEX,
    STATUS_MODELS,
    BatchStatusModel,
    ProgressEventModel,
    StatusEventModel,
    StepEventModel,
)

_REF_PREFIX = "#/components/schemas/"


class ErrorModel(BaseModel):
    """Every error answer: a code to branch on and a message for a person."""

    error: str = Field(description="machine-readable code, e.g. unknown_batch")
    message: str = Field(description="what happened and what to do")


class OverCapacityModel(BaseModel):
    """503: a cap of the server is full. `setting` is the variable that raises it."""

    # Written by ops/http_guard.py's ``over_capacity_body`` (also below the ASGI app); described here.
    error: Literal["over_capacity"]
    message: str
    cap: Literal["connections", "event_streams"]
    limit: int = Field(ge=1)
    setting: str = Field(description="e.g. DURABLE_API_MAX_CONNECTIONS")


class LimitExceededModel(BaseModel):
    """431 / 408 written before any route runs; the connection is then closed."""

    # Written by ops/http_guard.py's protocol before any route runs; described here.
    error: Literal["header_too_large", "header_timeout"]
    message: str
    setting: str = Field(description="e.g. DURABLE_API_MAX_HEADER_BYTES")


class HealthModel(BaseModel):
    status: Literal["ok"]


class CancelAcceptedModel(BaseModel):
    """202: the cancel is recorded (or the batch had already ended)."""

    id: str
    result: Literal["cancel requested", "canceled", "already finished"] = Field(
        description="the same answer `job cancel` prints"
    )


_API_MODELS: tuple[type[BaseModel], ...] = (
    ErrorModel,
    OverCapacityModel,
    LimitExceededModel,
    HealthModel,
    CancelAcceptedModel,
)


def _component_name(name: str, schema: dict[str, Any]) -> str:
    """Pydantic's name for a schema -> its name in ``components/schemas``.

    A model is named without its ``Model`` suffix: ``BatchStatus``, ``Step``, ``Progress`` are the
    names the document had before it was generated, the names clients generate code from. An enum
    gets a ``Value`` suffix, since its own name (``BatchStatus``) is the object's.
    """
    return f"{name}Value" if "enum" in schema else name.removesuffix("Model")


def _tidy(node: Any, names: dict[str, str]) -> Any:
    """Pydantic's output as this document writes it.

    ``$ref`` renamed (``names``: pydantic's name -> ours); the ``title`` pydantic derives from
    each name dropped (``Run Ids`` says nothing ``run_ids`` does not); docstring line breaks folded.
    """
    if isinstance(node, list):
        return [_tidy(item, names) for item in node]
    if not isinstance(node, dict):
        return node
    out: dict[str, Any] = {}
    for key, value in node.items():
        if key == "title":
            continue
        if key == "$ref":
            out[key] = _REF_PREFIX + names[value.removeprefix(_REF_PREFIX)]
        elif key == "description":
            out[key] = " ".join(value.split())
        elif key == "properties":  # names, not keywords: keep every one (a property may be `title`)
            out[key] = {name: _tidy(schema, names) for name, schema in value.items()}
        else:
            out[key] = _tidy(value, names)
    return out


def _component_schemas() -> tuple[dict[str, Any], dict[str, str]]:
    """Every model's JSON Schema (serialization side: what the server writes) by component name,
    and the component name of each pydantic name."""
    _, top = models_json_schema(
        [(model, "serialization") for model in (*_API_MODELS, *STATUS_MODELS)],
        ref_template=_REF_PREFIX + "{model}",
    )
    defs: dict[str, Any] = top["$defs"]
    names = {name: _component_name(name, schema) for name, schema in defs.items()}
    return {names[name]: _tidy(schema, names) for name, schema in defs.items()}, names


SCHEMAS, _NAMES = _component_schemas()


def _ref(model: type[BaseModel]) -> dict[str, str]:
    return {"$ref": _REF_PREFIX + _NAMES[model.__name__]}


def _json(schema: dict[str, Any], description: str) -> dict[str, Any]:
    return {"description": description, "content": {"application/json": {"schema": schema}}}


def _error(description: str) -> dict[str, Any]:
    return _json(_ref(ErrorModel), description)


def _sse(event: str, payload: type[BaseModel]) -> dict[str, Any]:
    return {
        "type": "object",
        "required": ["event", "id", "data"],
        "properties": {
            "event": {"const": event},
            "id": {"type": "string", "pattern": "^[0-9]+$"},
            "data": {
                "type": "string",
                "contentMediaType": "application/json",
                "contentSchema": _ref(payload),
            },
        },
    }


SCHEMAS["ServerSentEvent"] = {
    "description": "One event of GET /runs/{id}/events, as its `event:`, `id:` and `data:` fields.",
    "oneOf": [
        _sse("progress", ProgressEventModel),
        _sse("step", StepEventModel),
        _sse("status", StatusEventModel),
    ],
}

_ID_PARAM = {
    "name": "id",
    "in": "path",
    "required": True,
    "description": "the batch ID given to `job run --id`",
    "schema": {"type": "string", "pattern": BATCH_ID_REGEX},
}
_BAD_ID = _error("malformed batch ID")
_UNKNOWN = _error("no batch with this ID")

_OVER_CONNECTIONS = _json(
    _ref(OverCapacityModel),
    "the cap of requests in progress is full (`cap`: connections; closed after the answer)",
)
_OVER_STREAMS = _json(
    _ref(OverCapacityModel),
    "a cap is full: too many requests in progress, or too many open event streams (`cap`: event_streams)",
)
_HEADER_TOO_LARGE = _json(_ref(LimitExceededModel), "the request head is over the size limit (then closed)")


HEALTHZ: dict[str, Any] = {
    "operationId": "healthz",
    "summary": "Liveness; never needs the token",
    "security": [],
    "responses": {"200": _json(_ref(HealthModel), "the server is up")},
}
LIST_RUNS: dict[str, Any] = {
    "operationId": "listRuns",
    "summary": "Batches, newest first (without `steps`)",
    "parameters": [
        {
            "name": "job",
            "in": "query",
            "required": False,
            "description": "only the batches of this durable job (as `job list --job NAME`)",
            "schema": {"type": "string"},
        },
        {
            "name": "limit",
            "in": "query",
            "required": False,
            "description": "at most this many batches (as `job list --limit N`); a `Link: <...>; "
            'rel="next"` header points at the next page when there is one',
            "schema": {"type": "integer", "minimum": 1, "maximum": 1000, "default": 50},
        },
        {
            "name": "before",
            "in": "query",
            "required": False,
            "description": "only batches older than this batch (as `job list --before ID`); 404 if "
            "there is no such batch",
            "schema": {"type": "string", "pattern": BATCH_ID_REGEX},
        },
    ],
    "responses": {
        "200": _json({"type": "array", "items": _ref(BatchStatusModel)}, "a page of batches, newest first"),
        "404": _error("`before` names no batch"),
        "422": _error("no durable job of that name is registered, or a bad `limit` or `before`"),
    },
}
GET_RUN: dict[str, Any] = {
    "operationId": "getRun",
    "summary": "A batch's status: the JSON of `job status --json`",
    "parameters": [_ID_PARAM],
    "responses": {"200": _json(_ref(BatchStatusModel), "the batch"), "404": _UNKNOWN, "422": _BAD_ID},
}
RUN_EVENTS: dict[str, Any] = {
    "operationId": "streamRunEvents",
    "summary": "Server-Sent Events: progress, step and status",
    "description": (
        "Events `progress` (ProgressEvent), `step` (StepEvent) and `status` (StatusEvent), each with "
        "an `id:` that increases: `run_index * "
        f"{RUN_STRIDE}` + the Dagster event-log storage id, where run_index is the run's position in "
        "the batch's lineage. The history is sent first, then live events. The stream ends after "
        "the status event that finishes the batch's newest run. A `: keepalive` comment is sent "
        "after 15 s of silence. Send `Last-Event-ID` to resume after that event: no event is sent "
        "twice and none is skipped."
    ),
    "parameters": [
        _ID_PARAM,
        {
            "name": "access_token",
            "in": "query",
            "required": False,
            "description": "the bearer token, for clients that cannot send headers (a browser's "
            "EventSource); accepted on this route only, ignored when an Authorization header is "
            "sent, and never logged. See docs/api.md",
            "schema": {"type": "string"},
        },
        {
            "name": "Last-Event-ID",
            "in": "header",
            "required": False,
            "description": "id of the last event received: resume after it (empty: from the start)",
            "schema": {"type": "string", "pattern": "^[0-9]{0,18}$"},
        },
    ],
    "responses": {
        "200": {
            "description": "the event stream; the schema describes one event (before OpenAPI 3.2's "
            "`itemSchema`, `schema` of text/event-stream describes each event)",
            "content": {"text/event-stream": {"schema": {"$ref": _REF_PREFIX + "ServerSentEvent"}}},
        },
        "204": {"description": "resumed after the last event of a batch that has ended: nothing more"},
        "404": _UNKNOWN,
        "422": _error("malformed batch ID or Last-Event-ID"),
        "503": _OVER_STREAMS,
    },
}
CANCEL_RUN: dict[str, Any] = {
    "operationId": "cancelRun",
    "summary": "Ask the batch to stop (same effect as `job cancel`)",
    "description": (
        "The cancel is committed before the answer. The worker stops at the next step boundary or "
        "side-effect chunk, and no side effect is requested after it. A finished batch answers "
        "`already finished`; one whose worker was lost (its lease lapsed) is marked canceled at once "
        "and answers `canceled`."
    ),
    "parameters": [_ID_PARAM],
    "responses": {"202": _json(_ref(CancelAcceptedModel), "accepted"), "404": _UNKNOWN, "422": _BAD_ID},
}
RUN_FILE: dict[str, Any] = {
    "operationId": "getRunFile",
    "summary": "A file a step of the batch wrote for people (its quarantine, its report), from any host",
    "description": (
        "The status JSON's `files` lists them (`name`, `uri`). Read from wherever the batch's storage "
        "keeps it (the instance folder, the database, an S3 bucket), so it answers on any host of the "
        "deployment. CSV files are `text/csv`."
    ),
    "parameters": [
        _ID_PARAM,
        {
            "name": "name",
            "in": "path",
            "required": True,
            "description": "a file's `name` from the status JSON's `files`",
            "schema": {"type": "string"},
        },
    ],
    "responses": {
        "200": {
            "description": "the file's bytes",
            "content": {
                "text/csv": {"schema": {"type": "string"}},
                "application/octet-stream": {"schema": {"type": "string", "format": "binary"}},
            },
        },
        "404": _error("no batch with this ID, or no file of that name in it (or retention removed it)"),
        "422": _BAD_ID,
    },
}
METRICS: dict[str, Any] = {
    "operationId": "metrics",
    "summary": (
        "Prometheus text exposition: batches (and those needing review), side effects by scope, "
        "lease expiries, resumes, webhooks, steps"
    ),
    "description": "Names and meanings: docs/metrics.md. Values are derived from storage at scrape time.",
    "responses": {
        "200": {
            "description": "metrics in the Prometheus text format 0.0.4",
            "content": {"text/plain": {"schema": {"type": "string"}}},
        }
    },
}
OPENAPI: dict[str, Any] = {
    "operationId": "openapi",
    "summary": "This document",
    "responses": {"200": _json({"type": "object"}, "the OpenAPI document")},
}


def _naming_jobs(param: dict[str, Any], job_names: tuple[str, ...]) -> dict[str, Any]:
    if param.get("name") == "job" and param.get("in") == "query":
        return {**param, "schema": {"type": "string", "enum": list(job_names)}}
    return param


def document(
    operations: list[tuple[str, str, dict[str, Any]]],
    *,
    auth: bool,
    always_served: frozenset[str] = frozenset({"/healthz"}),
    job_names: tuple[str, ...] = (),
) -> dict[str, Any]:
    """The OpenAPI document for ``(path, method, operation)`` triples; ``auth``: a token is required.

    ``always_served``: paths answered even past the connection cap; every other route can be 503.
    ``job_names``: the registered durable jobs, the values a ``job`` query parameter takes.
    """
    paths: dict[str, dict[str, Any]] = {}
    for path, method, operation in operations:
        op = dict(operation)
        if job_names and "parameters" in op:
            op["parameters"] = [_naming_jobs(param, job_names) for param in op["parameters"]]
        op["responses"] = dict(op["responses"])
        op["responses"]["431"] = _HEADER_TOO_LARGE
        if path not in always_served:
            op["responses"].setdefault("503", _OVER_CONNECTIONS)
        if auth and op.get("security") != []:
            op["responses"]["401"] = _error("missing or wrong bearer token")
            op["responses"].setdefault("400", _error("more than one Authorization header"))
        op["responses"].setdefault("500", _error("unexpected server error (details in the server log)"))
        paths.setdefault(path, {})[method.lower()] = op
    doc: dict[str, Any] = {
        "openapi": "3.1.0",
        "info": {
            "title": "durable-assets status API",
            "version": "1",
            "description": "Status, progress and cancel of the batches of every durable job (`job serve`).",
        },
        "paths": paths,
        "components": {"schemas": SCHEMAS},
    }
    if auth:
        doc["components"]["securitySchemes"] = {"bearerAuth": {"type": "http", "scheme": "bearer"}}
        doc["security"] = [{"bearerAuth": []}]
    return doc
