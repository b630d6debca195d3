"""Every answer of the payment simulator, checked against Stripe's published schemas.

``stripe_schemas.json`` is a trimmed copy of the components of Stripe's OpenAPI description for
the objects the simulator serves (its header names the repository, path, commit and date;
``scripts/trim_stripe_schemas.py`` regenerates it). Stripe's OpenAPI 3.0 dialect is turned into
JSON Schema here, honestly: ``nullable`` allows null, ``anyOf`` of an ID and an object (an
expandable field) stays an ``anyOf``, and extensions (``x-expansionResources`` ...) and formats
(``unix-time``) are annotations with no effect. Components the trimmed copy leaves out are stubs
that reject any value, so serving one of them fails here until it is added.

The pinned spec is older than Stripe's current API, so the field names of Stripe's current
examples of every served object (``x-current-fixtures``) are checked too.

Requests are checked as well (issue #34): ``x-operations`` holds each operation's form body or
query parameters as the description gives them, and every request the gateway (and the SDK's
customer update and charge list) sends must use only those, in their types.
"""

from __future__ import annotations

import json
import re
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl

import httpx
import jsonschema_rs
import pytest
import stripe

from durable_assets.payments.gateway import StripeGateway
from durable_assets_testing.simulator import SimulatorHandler, SimulatorServer
from tests.support.polling import wait_until
from tests.support.simulator import ThreadedSimulator

SCHEMAS = json.loads((Path(__file__).parent / "stripe_schemas.json").read_text(encoding="utf-8"))
API_KEY = "sk_test_schemas"
AUTH = {"Authorization": f"Bearer {API_KEY}"}
#: Fields of Stripe's current examples the simulator leaves out, and why. Shrink, never grow silently.
NOT_SERVED = {
    "charge": {"source"},  # the deprecated Sources API; charges here have no payment source
    "refund": {"customer", "customer_account", "payment_method"},  # newer than what the pipeline reads
    "customer": set(),
    # newer than the pinned spec; the simulator has no checkout sessions or customer accounts
    "customer_balance_transaction": {"checkout_session", "customer_account"},
}
#: Fields the simulator serves that are newer than the pinned spec (present in current examples).
NEWER_THAN_SPEC = {"refund": {"destination_details"}}


def openapi_to_json_schema(node: Any) -> Any:
    """OpenAPI 3.0 schema objects to JSON Schema 2020-12 (``nullable`` is the one real difference)."""
    if isinstance(node, list):
        return [openapi_to_json_schema(item) for item in node]
    if not isinstance(node, dict):
        return node
    converted: dict[str, Any] = {}
    for key, value in node.items():
        if key.startswith("x-") or key in ("nullable", "format"):
            continue
        if key == "properties":  # names, not keywords: keep them all
            converted[key] = {name: openapi_to_json_schema(schema) for name, schema in value.items()}
        else:
            converted[key] = openapi_to_json_schema(value)
    if node.get("nullable") is True:
        return {"anyOf": [converted, {"type": "null"}]}
    return converted


COMPONENTS = openapi_to_json_schema(SCHEMAS["components"])


def validator(component: str) -> jsonschema_rs.Draft202012Validator:
    return jsonschema_rs.Draft202012Validator(
        {
            "$schema": "https://json-schema.org/draft/2020-12/schema",
            "$ref": f"#/components/schemas/{component}",
            "components": COMPONENTS,
        }
    )


LISTS = (
    "refund_list",
    "charge_list",
    "charge_refund_list",
    "customer_list",
    "customer_balance_transaction_list",
)
OBJECTS = ("charge", "refund", "customer", "customer_balance_transaction")
#: Served, but not compared with Stripe's current examples (the account's hold dozens of fields
#: about a business that the simulator has no notion of; it serves what the SDK and we read).
OTHER_OBJECTS = ("account", "deleted_customer")
VALIDATORS = {name: validator(name) for name in (*OBJECTS, *OTHER_OBJECTS, *LISTS, "error")}


@dataclass(frozen=True)
class Answer:
    method: str
    path: str
    status: int
    body: Any


def schema_errors(answer: Answer) -> list[str]:
    if answer.status >= 400:
        component = "error"
    elif isinstance(answer.body, dict) and answer.body.get("object") == "list":
        component = list_component(answer.path)
    elif isinstance(answer.body, dict) and answer.body.get("deleted") is True:
        component = f"deleted_{answer.body.get('object')}"
    else:
        component = str(answer.body.get("object")) if isinstance(answer.body, dict) else "?"
    if component not in VALIDATORS:
        return [f"no schema for {component!r}"]
    return [
        f"{'/'.join(map(str, error.instance_path))}: {error.message}"
        for error in VALIDATORS[component].iter_errors(answer.body)
    ]


def list_component(path: str) -> str:
    """Which of Stripe's list schemas a list route answers with."""
    route = path.partition("?")[0]
    if route == "/v1/charges":
        return "charge_list"
    if route.startswith("/v1/charges/"):
        return "charge_refund_list"
    if route.startswith("/v1/customers/") and route.endswith("/balance_transactions"):
        return "customer_balance_transaction_list"
    return "customer_list" if route == "/v1/customers" else "refund_list"


@pytest.fixture
def recorded(tmp_path: Path) -> Iterator[tuple[SimulatorServer, list[Answer]]]:
    """A simulator whose every ``/v1`` answer is recorded as sent (status and parsed body)."""
    answers: list[Answer] = []
    lock = threading.Lock()

    class Recording(SimulatorHandler):
        def _send(self, response: Any) -> None:
            if self.path.startswith("/v1"):
                with lock:
                    body = json.loads(json.dumps(response.body))  # as it goes on the wire
                    answers.append(Answer(self.command, self.path, response.status, body))
            super()._send(response)

    with ThreadedSimulator(tmp_path / "schemas.db", seed=3) as served:
        served.server.RequestHandlerClass = Recording  # before the first request, read per request
        yield served.server, answers


def exercise(sim: SimulatorServer, http: httpx.Client) -> None:
    """Every route, every kind of success and every kind of error the simulator answers."""

    def post(path: str, data: dict[str, str], key: str | None = None) -> dict[str, Any]:
        headers = {**AUTH, **({"Idempotency-Key": key} if key else {})}
        return dict(http.post(path, data=data, headers=headers).json())

    charge = post("/v1/charges", {"amount": "1000", "currency": "usd", "metadata[k]": "v"}, "c1")
    post("/v1/charges", {"amount": "1000", "currency": "usd", "metadata[k]": "v"}, "c1")  # replay
    post("/v1/charges", {"amount": "500", "currency": "eur", "customer": "cus_1", "description": "d"})
    refunds = [
        post("/v1/refunds", {"charge": charge["id"], "amount": "100", "reason": "duplicate"}, "r1"),
        post("/v1/refunds", {"charge": charge["id"], "amount": "100", "reason": "duplicate"}, "r1"),  # replay
        post("/v1/refunds", {"charge": charge["id"], "amount": "50", "expand[]": "charge"}, "r2"),
        post("/v1/refunds", {"charge": charge["id"], "amount": "25", "metadata[a]": "b"}),
    ]
    for query in ("", "?expand[]=charge", "?expand[]=charge&expand[]=transfer_reversal"):
        http.get(f"/v1/refunds/{refunds[0]['id']}{query}", headers=AUTH)
    for params in (
        {},
        {"limit": "1"},
        {"charge": charge["id"], "limit": "2", "starting_after": refunds[3]["id"]},
        {"limit": "2", "ending_before": refunds[0]["id"]},
        {"expand[]": "data.charge"},
    ):
        http.get("/v1/refunds", params=params, headers=AUTH)
        http.get(f"/v1/charges/{charge['id']}/refunds", params=params, headers=AUTH)
    http.get(f"/v1/charges/{charge['id']}", headers=AUTH)
    for params in (
        {},
        {"limit": "1"},
        {"customer": "cus_1"},
        {"limit": "1", "starting_after": charge["id"]},
        {"expand[]": "data.refunds"},
    ):
        http.get("/v1/charges", params=params, headers=AUTH)
    http.get("/v1/charges", params={"starting_after": "ch_missing"}, headers=AUTH)
    http.get("/v1/charges", params={"created": "1"}, headers=AUTH)
    post("/v1/charges", {"amount": "100", "currency": "xyz"})  # Stripe's currencies only
    post("/v1/customers", {"email": "k@example.com"}, "c1")  # a charge's key on another endpoint
    http.get(f"/v1/charges/{charge['id']}?expand[]=refunds&expand[]=balance_transaction", headers=AUTH)

    # errors: validation, missing objects, idempotency, auth, routing, cursors, expansion
    post("/v1/refunds", {"charge": charge["id"], "color": "red"})
    post("/v1/refunds", {"charge": "ch_missing"})
    post("/v1/refunds", {"charge": charge["id"], "amount": "999999"})
    post("/v1/refunds", {"charge": charge["id"], "amount": "7"}, "r1")  # key reused, other params
    post("/v1/refunds", {"charge": charge["id"], "expand[]": "color"})
    post("/v1/charges", {"amount": "1", "currency": "usd", "expand[]": "customer"})
    post("/v1/charges", {"amount": "x", "currency": "usd"})
    http.get("/v1/refunds/re_missing", headers=AUTH)
    http.get("/v1/charges/ch_missing", headers=AUTH)
    http.get("/v1/charges/ch_missing/refunds", headers=AUTH)
    http.get("/v1/refunds", params={"starting_after": "re_missing"}, headers=AUTH)
    http.get("/v1/refunds", params={"limit": "1000"}, headers=AUTH)
    http.get("/v1/refunds")
    http.get("/v1/refunds", headers={"Authorization": "Bearer sk_live_unknown"})
    http.get("/v1/nothing-here", headers=AUTH)
    http.get("/v1/account", headers=AUTH)
    http.get("/v1/account", params={"expand[]": "settings"}, headers=AUTH)
    http.get("/v1/refunds", headers=[("Authorization", f"Bearer {API_KEY}"), ("Authorization", "Bearer x")])

    exercise_customers(post, http)

    # faults: injected 500, rate limit (429), an in-flight key (409)
    sim.configure(error_rate=1.0)
    http.get("/v1/refunds", headers=AUTH)
    sim.configure(error_rate=0.0, rate_limit=0.5)
    http.get("/v1/refunds", headers=AUTH)
    http.get("/v1/refunds", headers=AUTH)
    sim.configure(rate_limit=None, latency_ms=300)
    slow = {"charge": charge["id"], "amount": "1"}
    holder = threading.Thread(target=post, args=("/v1/refunds", slow, "r9"))
    holder.start()
    wait_until(lambda: sim.in_flight_count(), timeout=5, interval=0.005, what="the first request in flight")
    post("/v1/refunds", slow, "r9")
    holder.join(timeout=10)
    sim.configure(latency_ms=0)


def exercise_customers(post: Any, http: httpx.Client) -> None:
    """Customers and their balance transactions: successes, replays, expansions and errors."""
    meta = {"metadata[legacy_account_id]": "L1"}
    customer = post("/v1/customers", {"email": "ada@example.com", "name": "Ada", **meta}, "cu1")
    post("/v1/customers", {"email": "ada@example.com", "name": "Ada", **meta}, "cu1")  # replay
    other = post("/v1/customers", {})
    path = f"/v1/customers/{customer['id']}"
    moves = [
        post(f"{path}/balance_transactions", {"amount": "-5000", "currency": "usd"}, "bt1"),
        post(f"{path}/balance_transactions", {"amount": "-5000", "currency": "usd"}, "bt1"),  # replay
        post(
            f"{path}/balance_transactions", {"amount": "1200", "currency": "usd", "description": "d", **meta}
        ),
        post(
            f"{path}/balance_transactions", {"amount": "-1", "currency": "usd", "expand[]": "customer"}, "bt2"
        ),
    ]
    update = {"email": "ada@lovelace.example", "description": "d", "metadata[legacy_account_id]": ""}
    post(path, update, "up1")
    post(path, update, "up1")  # replay
    post(path, {"name": "", "metadata": ""})
    post(path, {"email": "not-an-email"})
    post(path, {"phone": "+1"})
    post(path, {"name": "x"}, "cu1")  # the create's key on the update's endpoint
    post("/v1/customers/cus_missing", {"name": "x"})
    post(f"{path}/balance_transactions", {"amount": "-1", "currency": "xyz"})
    for query in ("", "?expand[]=test_clock&expand[]=invoice_settings"):
        http.get(f"{path}{query}", headers=AUTH)
    for params in (
        {},
        {"limit": "1"},
        {"email": "ada@example.com"},
        {"limit": "1", "starting_after": customer["id"]},
        {"ending_before": customer["id"]},
        {"expand[]": "data.address"},
    ):
        http.get("/v1/customers", params=params, headers=AUTH)
    for params in (
        {},
        {"limit": "1", "starting_after": moves[0]["id"]},
        {"limit": "1", "ending_before": moves[0]["id"]},
        {"expand[]": "data.customer"},
    ):
        http.get(f"{path}/balance_transactions", params=params, headers=AUTH)
    http.get(f"/v1/customers/{other['id']}/balance_transactions", headers=AUTH)  # empty list

    # errors: validation, missing customers, the currency rule, idempotency, expansion
    post("/v1/customers", {"email": "not-an-email"})
    post("/v1/customers", {"email": "a@b.c", "color": "red"})
    post("/v1/customers", {"email": "other@b.c"}, "cu1")  # key reused, other params
    post("/v1/customers", {"expand[]": "tax"})
    post(f"{path}/balance_transactions", {"amount": "-1", "currency": "eur"})  # balance is in usd
    post(f"{path}/balance_transactions", {"amount": "0", "currency": "usd"})
    post(f"{path}/balance_transactions", {"currency": "usd"})
    post(f"{path}/balance_transactions", {"amount": "-6", "currency": "usd"}, "bt1")
    post("/v1/customers/cus_missing/balance_transactions", {"amount": "-1", "currency": "usd"})
    http.get("/v1/customers/cus_missing", headers=AUTH)
    http.get("/v1/customers/cus_missing/balance_transactions", headers=AUTH)
    http.get("/v1/customers", params={"starting_after": "cus_missing"}, headers=AUTH)
    http.get(f"{path}/balance_transactions", params={"ending_before": "cbtxn_missing"}, headers=AUTH)
    http.get("/v1/customers", params={"expand[]": "data.sources"}, headers=AUTH)

    # one balance transaction, then deletion: the deleted customer, and what a deleted one refuses
    http.get(f"{path}/balance_transactions/{moves[0]['id']}", headers=AUTH)
    http.get(f"{path}/balance_transactions/{moves[0]['id']}?expand[]=customer", headers=AUTH)
    http.get(f"/v1/customers/{other['id']}/balance_transactions/{moves[0]['id']}", headers=AUTH)
    http.delete(f"/v1/customers/{other['id']}", headers=AUTH)
    http.get(f"/v1/customers/{other['id']}", headers=AUTH)
    http.delete(f"/v1/customers/{other['id']}", headers=AUTH)
    post(f"/v1/customers/{other['id']}/balance_transactions", {"amount": "-1", "currency": "usd"})
    http.delete("/v1/customers/cus_missing", headers=AUTH)


def test_every_answer_matches_stripes_schemas(recorded: tuple[SimulatorServer, list[Answer]]) -> None:
    sim, answers = recorded
    with httpx.Client(base_url=sim.url, timeout=10) as http:
        exercise(sim, http)

    statuses = {answer.status for answer in answers}
    objects = {answer.body.get("object") for answer in answers if answer.status == 200}
    failures = {
        f"{answer.method} {answer.path} -> {answer.status}": errors
        for answer in answers
        if (errors := schema_errors(answer))
    }

    assert statuses == {200, 400, 401, 404, 409, 429, 500}
    assert objects == {"charge", "refund", "customer", "customer_balance_transaction", "account", "list"}
    assert any(answer.body.get("deleted") is True for answer in answers)
    lists = {list_component(answer.path) for answer in answers if answer.body.get("object") == "list"}
    assert lists == set(LISTS)
    assert failures == {}
    assert any("/v1/customers/cus_" in a.path and a.method == "POST" and a.status == 200 for a in answers)


def test_the_schemas_reject_what_stripe_would_not_send() -> None:
    """The validation has teeth: a wrong type, a missing required field, an unserved object."""
    refund = {
        "id": "re_1",
        "object": "refund",
        "amount": 1,
        "created": 1,
        "currency": "usd",
        "charge": "ch_1",
    }

    assert schema_errors(Answer("GET", "/v1/refunds/re_1", 200, refund)) == []
    assert schema_errors(Answer("GET", "/", 200, {**refund, "amount": "1"}))
    assert schema_errors(Answer("GET", "/", 200, {k: v for k, v in refund.items() if k != "created"}))
    assert schema_errors(Answer("GET", "/", 200, {**refund, "payment_intent": {"id": "pi_1"}}))
    assert schema_errors(Answer("GET", "/", 200, {**refund, "charge": {"object": "charge"}}))
    assert schema_errors(Answer("GET", "/", 400, {"error": {"message": "no type"}}))
    account = {"id": "acct_1", "object": "account", "charges_enabled": True}
    assert schema_errors(Answer("GET", "/v1/account", 200, account)) == []
    assert schema_errors(Answer("GET", "/v1/account", 200, {**account, "charges_enabled": "yes"}))
    assert schema_errors(Answer("GET", "/v1/account", 200, {**account, "settings": {"x": 1}}))
    deleted = {"id": "cus_1", "object": "customer", "deleted": True}
    assert schema_errors(Answer("DELETE", "/v1/customers/cus_1", 200, deleted)) == []
    assert schema_errors(Answer("DELETE", "/", 200, {**deleted, "deleted": "yes"}))


def test_fields_match_stripes_schema_and_current_examples(
    recorded: tuple[SimulatorServer, list[Answer]],
) -> None:
    sim, _ = recorded
    with httpx.Client(base_url=sim.url, timeout=10, headers=AUTH) as http:
        charge = http.post("/v1/charges", data={"amount": "100", "currency": "usd"}).json()
        refund = http.post("/v1/refunds", data={"charge": charge["id"]}).json()
        customer = http.post("/v1/customers", data={"email": "a@b.c"}).json()
        path = f"/v1/customers/{customer['id']}/balance_transactions"
        transaction = http.post(path, data={"amount": "-100", "currency": "usd"}).json()
    current = SCHEMAS["x-current-fixtures"]["fields"]
    schemas = SCHEMAS["components"]["schemas"]
    served_objects = {"charge": charge, "refund": refund, "customer": customer}
    served_objects["customer_balance_transaction"] = transaction

    assert set(served_objects) == set(OBJECTS)
    for name, served in served_objects.items():
        in_spec = set(schemas[name]["properties"])
        assert set(current[name]) - set(served) == NOT_SERVED[name], name
        assert set(served) - in_spec == NEWER_THAN_SPEC.get(name, set()), name
        assert set(served) <= in_spec | set(current[name]), name


# --- what clients send: the parameters of each operation, as Stripe's description has them ---------

OPERATIONS = SCHEMAS["x-operations"]
#: A request path's operation in Stripe's description (ids replaced by its path parameters).
_TEMPLATES = (
    (
        re.compile(r"^/v1/customers/[^/]+/balance_transactions$"),
        "/v1/customers/{customer}/balance_transactions",
    ),
    (re.compile(r"^/v1/customers/[^/]+$"), "/v1/customers/{customer}"),
)
_INTEGER = re.compile(r"^-?[0-9]+$")


def operation_of(method: str, path: str) -> str:
    for pattern, template in _TEMPLATES:
        if pattern.match(path):
            return f"{method} {template}"
    return f"{method} {path}"


def parameter_errors(method: str, path: str, encoded: str) -> list[str]:
    """What in a form body or query Stripe's description of the operation does not take.

    Bracketed names are one parameter (``metadata[k]``, ``expand[0]``); a scalar's value is checked
    against its schema's type, ``maxLength`` and ``enum``; a body's ``required`` must be present.
    """
    operation = operation_of(method, path)
    if operation not in OPERATIONS:
        return [f"{operation}: not in the trimmed description (add it to OPERATIONS in the trim script)"]
    described = OPERATIONS[operation]
    body = described.get("body")
    schemas = body["properties"] if body else described["query"]
    sent = parse_qsl(encoded, keep_blank_values=True)
    names = {name.partition("[")[0] for name, _ in sent}
    errors = [
        f"{operation}: required {name!r} missing"
        for name in (body or {}).get("required", [])
        if name not in names
    ]
    for name, value in sent:
        top, bracket, _ = name.partition("[")
        schema = schemas.get(top)
        if schema is None:
            errors.append(f"{operation}: {top!r} is not a parameter of the operation")
        elif not bracket:
            errors += [
                f"{operation}: {top}={value!r}: {problem}" for problem in _scalar_problems(schema, value)
            ]
    return errors


def _scalar_problems(schema: dict[str, Any], value: str) -> list[str]:
    """A form value against a scalar schema, or against any scalar branch of an ``anyOf``."""
    branches = schema.get("anyOf", [schema])
    found = [_branch_problems(branch, value) for branch in branches]
    return [] if any(not problems for problems in found) else found[0]


def _branch_problems(schema: dict[str, Any], value: str) -> list[str]:
    kind = schema.get("type")
    if kind == "integer" and not _INTEGER.match(value):
        return ["not an integer"]
    if kind == "boolean" and value not in ("true", "false"):
        return ["not a boolean"]
    if kind in ("object", "array"):
        return [f"a {kind} sent as one value"]
    if "enum" in schema and value not in schema["enum"]:
        return [f"not one of {schema['enum']}"]
    if "maxLength" in schema and len(value) > schema["maxLength"]:
        return [f"longer than {schema['maxLength']}"]
    return []


@pytest.fixture
def requests_sent(tmp_path: Path) -> Iterator[tuple[SimulatorServer, list[tuple[str, str, str]]]]:
    """A simulator recording every ``/v1`` request as received: method, path and parameters."""
    sent: list[tuple[str, str, str]] = []
    lock = threading.Lock()

    class Recording(SimulatorHandler):
        def _handle_api(self, path: str, encoded_params: str) -> None:
            with lock:
                sent.append((self.command, path, encoded_params))
            super()._handle_api(path, encoded_params)

    with ThreadedSimulator(tmp_path / "params.db") as served:
        served.server.RequestHandlerClass = Recording
        yield served.server, sent


def test_what_the_gateway_and_the_sdk_send_is_what_stripe_describes(
    requests_sent: tuple[SimulatorServer, list[tuple[str, str, str]]],
) -> None:
    """Every request the pipelines' gateway makes (and the SDK's update and list) takes only parameters
    Stripe's description gives the operation, in their types: a parameter the simulator took but
    Stripe does not know would pass every test here and fail at Stripe."""
    sim, sent = requests_sent
    gateway = StripeGateway(sim.url, API_KEY, page_size=2)
    charge = gateway.create_charge(
        amount=1000, currency="usd", customer="cus_1", metadata={"invoice": "i1"}, idempotency_key="c1"
    )
    gateway.create_refund(
        charge_id=charge.id,
        amount=10,
        currency="usd",
        reason="other",
        metadata={"invoice": "i1"},
        idempotency_key="r1",
    )
    gateway.list_charge_refunds(charge.id)
    gateway.find_refund_by_key(charge_id=charge.id, idempotency_key="r1")
    customer = gateway.create_customer(
        email="a@example.com", name="A", metadata={"legacy_account_id": "L1"}, idempotency_key="cu1"
    )
    gateway.create_customer(email=None, name=None, metadata={}, idempotency_key="cu2")
    gateway.list_customers(email="a@example.com")
    gateway.find_customer(metadata_key="legacy_account_id", value="L1")
    gateway.create_balance_transaction(
        customer_id=customer.id,
        amount=-500,
        currency="usd",
        description="migrated",
        metadata={},
        idempotency_key="b1",
    )
    gateway.list_balance_transactions(customer.id)
    gateway.latest_balance_transaction(customer.id)
    client = stripe.StripeClient(
        API_KEY,
        base_addresses={"api": sim.url},
        max_network_retries=0,
        http_client=stripe.RequestsClient(timeout=10),
    )
    client.v1.customers.update(
        customer.id, params={"email": "b@example.com", "description": "d", "metadata": {"k": ""}}
    )
    client.v1.charges.list(params={"limit": 3, "customer": "cus_1", "expand": ["data.refunds"]})

    operations = {operation_of(method, path) for method, path, _ in sent}
    errors = [
        error
        for method, path, encoded in sent
        if operation_of(method, path) in OPERATIONS or encoded
        for error in parameter_errors(method, path, encoded)
    ]

    assert set(OPERATIONS) <= operations, set(OPERATIONS) - operations  # each one exercised
    assert errors == []


def test_the_parameter_check_has_teeth() -> None:
    assert (
        parameter_errors("POST", "/v1/charges", "amount=100&currency=usd&metadata[k]=v&expand[0]=customer")
        == []
    )
    assert parameter_errors("POST", "/v1/charges", "amount=1.5&currency=usd")
    assert parameter_errors("POST", "/v1/customers/cus_1", "colour=red")
    assert parameter_errors("POST", "/v1/customers/cus_1/balance_transactions", "amount=1")  # no currency
    assert parameter_errors("GET", "/v1/charges", "limit=x")
    assert parameter_errors("GET", "/v1/charges", "charge=ch_1")  # the refund list's filter, not this one's
    assert parameter_errors("DELETE", "/v1/customers/cus_1", "x=1")
