"""/openapi.json's schemas are generated from the models that write the status JSON: hold them to both.

To the contract: every status word of docs/contract.md is in the document's enums, and the enums hold
nothing else. To the data: the status JSON of a real batch (from `job status`'s code path and from
the server), every object of `GET /runs` and every event of its stream validate against the
document the server serves, with formats checked. A schema that accepted anything would pass the
first half, so a status outside the contract is shown to be rejected too.
"""

from __future__ import annotations

import json
from typing import Any

import httpx
import jsonschema_rs
import pytest

from durable_assets.ops import openapi
from durable_assets.ops.status_model import BatchStatus, StepEventStatus, StepStatus
from tests.api.conftest import FINISHED_BY_JOB, Served
from tests.api.helpers import read_stream
from tests.crash.helpers import instance_reader

#: docs/contract.md's words, written out here so that renaming a member cannot silently rename a word.
BATCH_WORDS = {"queued", "running", "canceling", "succeeded", "failed", "canceled"}
STEP_WORDS = {"pending", "in_progress", "completed", "failed", "skipped"}


def _validator(doc: dict[str, Any], component: str) -> jsonschema_rs.Draft202012Validator:
    return jsonschema_rs.Draft202012Validator(
        {"$ref": f"#/components/schemas/{component}", "components": doc["components"]},
        validate_formats=True,
    )


def _enum_at(schemas: dict[str, Any], component: str, prop: str) -> set[str]:
    """The enum of ``component.prop``, following its ``$ref``."""
    ref = schemas[component]["properties"][prop]["$ref"]
    return set(schemas[ref.removeprefix("#/components/schemas/")]["enum"])


def test_every_status_word_is_in_the_schemas_enums_and_nothing_else() -> None:
    schemas = openapi.SCHEMAS
    assert {s.value for s in BatchStatus} == BATCH_WORDS
    assert {s.value for s in StepStatus} == STEP_WORDS
    assert _enum_at(schemas, "BatchStatus", "status") == BATCH_WORDS
    assert _enum_at(schemas, "StatusEvent", "status") == BATCH_WORDS
    assert _enum_at(schemas, "Step", "status") == STEP_WORDS
    # The stream's step events add `retrying` (a moment, never a state `job status` shows).
    assert {s.value for s in StepEventStatus} == STEP_WORDS - {"pending"} | {"retrying"}
    assert _enum_at(schemas, "StepEvent", "status") == {s.value for s in StepEventStatus}


def test_the_status_json_fields_are_the_documented_ones() -> None:
    """The document lists exactly the fields the status JSON has; only `steps` and `decisions` (read
    with them, left out of `GET /runs`) may be left out."""
    batch = openapi.SCHEMAS["BatchStatus"]
    assert set(batch["required"]) == set(batch["properties"]) - {"steps", "decisions"}
    assert batch["properties"]["steps"] == {"type": "array", "items": {"$ref": "#/components/schemas/Step"}}
    step = openapi.SCHEMAS["Step"]
    assert set(step["required"]) == set(step["properties"])


@pytest.mark.parametrize("job_name", list(FINISHED_BY_JOB))
def test_a_real_batchs_status_list_and_events_validate_against_the_served_document(
    served: Served, job_name: str
) -> None:
    batch_id = served.batches[job_name]
    with httpx.Client(timeout=30, headers=served.auth) as client:
        doc = client.get(f"{served.url}/openapi.json").json()
        over_http = client.get(f"{served.url}/runs/{batch_id}").json()
        listed = client.get(f"{served.url}/runs").json()
    with instance_reader(served.home) as reader:
        in_process = json.loads(json.dumps(reader.status(batch_id)))
    status = _validator(doc, "BatchStatus")
    for body in (in_process, over_http, *listed):
        status.validate(body)
    assert over_http["steps"] and "steps" not in listed[0]

    assert not status.is_valid({**over_http, "status": "done"})  # the validator is not vacuous
    assert not status.is_valid({k: v for k, v in over_http.items() if k != "job"})

    payloads = {"progress": "ProgressEvent", "step": "StepEvent", "status": "StatusEvent"}
    validators = {event: _validator(doc, component) for event, component in payloads.items()}
    stream = read_stream(f"{served.url}/runs/{batch_id}/events", headers=served.auth, timeout=60)
    assert {e.event for e in stream.events} == set(payloads)
    for event in stream.events:
        validators[event.event].validate(event.data)
