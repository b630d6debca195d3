"""The OpenAPI 3.1 description of ``job serve``: schemas, and one operation object per route.

Written out rather than generated: the status JSON is a contract (CONTRACT.md), and a hand-kept
document next to the routes is checked against the running server by the fuzzing test
(tests/test_api_fuzz.py), which fails on any answer the document does not describe.
"""

from __future__ import annotations

from typing import Any

from durable_assets.kit.runlog import RUN_STRIDE

BATCH_ID_REGEX = "^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$"


def _ref(name: str) -> dict[str, str]:
    return {"$ref": f"#/components/schemas/{name}"}


def _nullable(schema: dict[str, Any]) -> dict[str, Any]:
    return {"anyOf": [schema, {"type": "null"}]}


def _json(schema: dict[str, Any], description: str) -> dict[str, Any]:
    return {"description": description, "content": {"application/json": {"schema": schema}}}


def _error(description: str) -> dict[str, Any]:
    return _json(_ref("Error"), description)


_STATUSES = ["queued", "running", "canceling", "succeeded", "failed", "canceled"]
_STEP_STATUSES = ["pending", "in_progress", "completed", "failed", "skipped"]
_TIMESTAMP = {"type": "string", "format": "date-time"}

SCHEMAS: dict[str, Any] = {
    "Error": {
        "type": "object",
        "required": ["error", "message"],
        "properties": {
            "error": {"type": "string", "description": "machine-readable code, e.g. unknown_batch"},
            "message": {"type": "string", "description": "what happened and what to do"},
        },
    },
    "OverCapacity": {
        "type": "object",
        "description": "503: a cap of the server is full. `setting` is the variable that raises it.",
        "required": ["error", "message", "cap", "limit", "setting"],
        "properties": {
            "error": {"type": "string", "const": "over_capacity"},
            "message": {"type": "string"},
            "cap": {"type": "string", "enum": ["connections", "event_streams"]},
            "limit": {"type": "integer", "minimum": 1},
            "setting": {"type": "string", "description": "e.g. DURABLE_API_MAX_CONNECTIONS"},
        },
    },
    "LimitExceeded": {
        "type": "object",
        "description": "431 / 408 written before any route runs; the connection is then closed.",
        "required": ["error", "message", "setting"],
        "properties": {
            "error": {"type": "string", "enum": ["header_too_large", "header_timeout"]},
            "message": {"type": "string"},
            "setting": {"type": "string", "description": "e.g. DURABLE_API_MAX_HEADER_BYTES"},
        },
    },
    "Health": {
        "type": "object",
        "required": ["status"],
        "properties": {"status": {"type": "string", "const": "ok"}},
    },
    "Progress": {
        "type": "object",
        "description": (
            "While the batch runs: the step running now (with its latest count when it has one); a "
            "report left by an earlier step or run is never shown as the running step's. Once the "
            "batch has ended: its final state (`Succeeded`, or `Failed: <step>` / `Canceled: <step>` "
            "with how far that step got)."
        ),
        "required": ["step", "total", "label", "done", "of"],
        "properties": {
            "step": {"type": "integer", "minimum": 1, "description": "step number, 1..total"},
            "total": {"type": "integer", "minimum": 1},
            "label": {"type": "string"},
            "done": {"type": "integer", "minimum": 0},
            "of": {
                "type": "integer",
                "minimum": 0,
                "description": "0 when the step has no count (nothing countable, or none reported yet)",
            },
        },
    },
    "Step": {
        "type": "object",
        "required": [
            "step",
            "step_name",
            "status",
            "executions",
            "input_hash",
            "output_ref",
            "started_at",
            "finished_at",
        ],
        "properties": {
            "step": {"type": "integer", "minimum": 1},
            "step_name": {"type": "string", "description": "the Dagster step key (asset name)"},
            "status": {
                "type": "string",
                "enum": _STEP_STATUSES,
                "description": "`skipped`: stopped by a cancel before its end (resume runs it)",
            },
            "executions": {"type": "integer", "minimum": 0, "description": "starts across the lineage"},
            "input_hash": _nullable({"type": "string"}),
            "output_ref": _nullable({"type": "string"}),
            "started_at": _nullable(_TIMESTAMP),
            "finished_at": _nullable(_TIMESTAMP),
        },
    },
    "BatchStatus": {
        "type": "object",
        "description": "The JSON of `job status --json` (CONTRACT.md). `GET /runs` omits `steps`.",
        "required": [
            "id",
            "status",
            "run_ids",
            "percent_complete",
            "progress",
            "needs_review",
            "held_for_review",
        ],
        "properties": {
            "id": {"type": "string", "pattern": BATCH_ID_REGEX},
            "status": {"type": "string", "enum": _STATUSES},
            "run_ids": {"type": "array", "items": {"type": "string"}, "minItems": 1},
            "percent_complete": {
                "type": "number",
                "minimum": 0,
                "maximum": 100,
                "description": "completed steps plus the running step's fraction, over all steps",
            },
            "progress": _nullable(_ref("Progress")),
            "needs_review": {
                "type": "boolean",
                "description": (
                    "items of the batch wait for a person (held_for_review > 0), whatever its status; "
                    "`job run`/`job resume` of such a finished batch exit 4"
                ),
            },
            "held_for_review": {
                "type": "integer",
                "minimum": 0,
                "description": (
                    "items held for review: the `held_for_review` materialization metadata of the "
                    "last step, in step order, that reports it (refunds: answers that did not match)"
                ),
            },
            "auto_resume": _nullable(
                {
                    "type": "object",
                    "description": "the daemon's automatic resumes after lost workers; null if none",
                    "required": ["attempts", "max_attempts", "run_ids"],
                    "properties": {
                        "attempts": {"type": "integer", "minimum": 1},
                        "max_attempts": {"type": "integer", "minimum": 0},
                        "run_ids": {"type": "array", "items": {"type": "string"}},
                    },
                }
            ),
            "steps": {"type": "array", "items": _ref("Step")},
        },
    },
    "CancelAccepted": {
        "type": "object",
        "required": ["id", "result"],
        "properties": {
            "id": {"type": "string"},
            "result": {
                "type": "string",
                "enum": ["cancel requested", "already finished"],
                "description": "the same answer `job cancel` prints",
            },
        },
    },
    # The event stream's payloads (each event's `data:` line), for clients; not JSON responses.
    "ProgressEvent": {
        "allOf": [
            _ref("Progress"),
            {
                "type": "object",
                "required": ["run_id", "timestamp"],
                "properties": {"run_id": {"type": "string"}, "timestamp": _TIMESTAMP},
            },
        ]
    },
    "StepEvent": {
        "type": "object",
        "required": ["step", "step_name", "status", "run_id", "timestamp"],
        "properties": {
            "step": {"type": "integer", "minimum": 1},
            "step_name": {"type": "string"},
            "status": {
                "type": "string",
                "enum": ["in_progress", "completed", "failed", "retrying", "skipped"],
            },
            "run_id": {"type": "string"},
            "timestamp": _TIMESTAMP,
        },
    },
    "StatusEvent": {
        "type": "object",
        "required": ["id", "status", "run_id", "timestamp"],
        "properties": {
            "id": {"type": "string"},
            "status": {"type": "string", "enum": _STATUSES},
            "run_id": {"type": "string"},
            "timestamp": _TIMESTAMP,
        },
    },
}


def _sse(event: str, payload: str) -> dict[str, Any]:
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
    "oneOf": [_sse("progress", "ProgressEvent"), _sse("step", "StepEvent"), _sse("status", "StatusEvent")],
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
    _ref("OverCapacity"),
    "the connection cap is full (`cap`: connections; closed after the answer)",
)
_OVER_STREAMS = _json(
    _ref("OverCapacity"),
    "a cap is full: too many connections, or too many open event streams (`cap`: event_streams)",
)
_HEADER_TOO_LARGE = _json(_ref("LimitExceeded"), "the request head is over the size limit (then closed)")


HEALTHZ: dict[str, Any] = {
    "operationId": "healthz",
    "summary": "Liveness; never needs the token",
    "security": [],
    "responses": {"200": _json(_ref("Health"), "the server is up")},
}
LIST_RUNS: dict[str, Any] = {
    "operationId": "listRuns",
    "summary": "Batches, newest first (without `steps`)",
    "responses": {"200": _json({"type": "array", "items": _ref("BatchStatus")}, "every batch")},
}
GET_RUN: dict[str, Any] = {
    "operationId": "getRun",
    "summary": "A batch's status: the JSON of `job status --json`",
    "parameters": [_ID_PARAM],
    "responses": {"200": _json(_ref("BatchStatus"), "the batch"), "404": _UNKNOWN, "422": _BAD_ID},
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
            "content": {"text/event-stream": {"schema": _ref("ServerSentEvent")}},
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
        "refund chunk, and no refund is requested after it. A finished batch answers `already finished`."
    ),
    "parameters": [_ID_PARAM],
    "responses": {"202": _json(_ref("CancelAccepted"), "accepted"), "404": _UNKNOWN, "422": _BAD_ID},
}
METRICS: dict[str, Any] = {
    "operationId": "metrics",
    "summary": (
        "Prometheus text exposition: batches (and those needing review), refunds, lease expiries, "
        "resumes, webhooks, steps"
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


def document(
    operations: list[tuple[str, str, dict[str, Any]]],
    *,
    auth: bool,
    always_served: frozenset[str] = frozenset({"/healthz"}),
) -> dict[str, Any]:
    """The OpenAPI document for ``(path, method, operation)`` triples; ``auth``: a token is required.

    ``always_served``: paths answered even past the connection cap; every other route can be 503.
    """
    paths: dict[str, dict[str, Any]] = {}
    for path, method, operation in operations:
        op = dict(operation)
        op["responses"] = dict(op["responses"])
        op["responses"]["431"] = _HEADER_TOO_LARGE
        if path not in always_served:
            op["responses"].setdefault("503", _OVER_CONNECTIONS)
        if auth and op.get("security") != []:
            op["responses"]["401"] = _error("missing or wrong bearer token")
        op["responses"].setdefault("500", _error("unexpected server error (details in the server log)"))
        paths.setdefault(path, {})[method.lower()] = op
    doc: dict[str, Any] = {
        "openapi": "3.1.0",
        "info": {
            "title": "durable-assets status API",
            "version": "1",
            "description": "Status, progress and cancel of refund batches (`job serve`).",
        },
        "paths": paths,
        "components": {"schemas": SCHEMAS},
    }
    if auth:
        doc["components"]["securitySchemes"] = {"bearerAuth": {"type": "http", "scheme": "bearer"}}
        doc["security"] = [{"bearerAuth": []}]
    return doc
