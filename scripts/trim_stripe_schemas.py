#!/usr/bin/env python3
"""Trims Stripe's published OpenAPI description to the objects the payment simulator serves.

Writes ``tests/payments/stripe_schemas.json``, which ``tests/payments/test_stripe_schemas.py``
validates every simulator answer against. Only that trimmed data is committed, never the spec.

Input: a git clone (or bare mirror) of https://github.com/stripe/openapi. The spec is read with
``git show COMMIT:openapi/spec3.json``; without ``--commit``, the newest commit on HEAD whose
spec blob can be read is used (a partial clone or a snapshot may lack the newest, largest blobs).
The components kept are charge, refund, customer, deleted_customer, customer_balance_transaction,
account and error, with the sub-objects they embed inline, and the lists of ``GET /v1/refunds``,
``GET /v1/charges/{charge}/refunds``, ``GET /v1/customers`` and
``GET /v1/customers/{customer}/balance_transactions`` and ``GET /v1/charges``; and the parameters of
the operations in OPERATIONS (form bodies and list queries, without their prose). Every other
``$ref`` (objects reached only through an expandable ID, or sub-objects the simulator always
answers as null) is replaced by a stub that *rejects* any value: a response that starts to carry
such an object fails validation until the component is added here, instead of passing against
nothing.

Stripe's newer API versions add fields faster than a pinned spec shows them, so the field names of
the served objects' examples in ``openapi/fixtures3.json`` at ``--fixtures-commit`` (default
HEAD) are recorded too; the test checks the simulator's fields against both.

    python scripts/trim_stripe_schemas.py --git-dir PATH/TO/stripe-openapi [--commit SHA]
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

REPOSITORY = "https://github.com/stripe/openapi"
SPEC_PATH = "openapi/spec3.json"
FIXTURES_PATH = "openapi/fixtures3.json"
OUT = Path(__file__).resolve().parent.parent / "tests" / "payments" / "stripe_schemas.json"
#: Components kept whole: what the simulator serves, and what those embed (not behind an expandable ID).
KEEP = (
    "charge",
    "refund",
    "error",
    "api_errors",
    "billing_details",
    "address",
    "charge_fraud_details",
    "charge_outcome",
    "customer",
    "customer_balance_transaction",
    "invoice_setting_customer_setting",
    "deleted_customer",
    "account",
)
#: List objects are inline in their paths; they are kept under these names.
LISTS = {
    "refund_list": ("/v1/refunds", "get"),
    "charge_list": ("/v1/charges", "get"),
    "charge_refund_list": ("/v1/charges/{charge}/refunds", "get"),
    "customer_list": ("/v1/customers", "get"),
    "customer_balance_transaction_list": ("/v1/customers/{customer}/balance_transactions", "get"),
}
#: The operations whose parameters are kept (a form body's properties, or a list's query parameters),
#: so a test can check that what a client sends is what Stripe's description says the operation takes.
OPERATIONS = (
    ("post", "/v1/charges"),
    ("get", "/v1/charges"),
    ("post", "/v1/refunds"),
    ("get", "/v1/refunds"),
    ("post", "/v1/customers"),
    ("get", "/v1/customers"),
    ("post", "/v1/customers/{customer}"),
    ("post", "/v1/customers/{customer}/balance_transactions"),
    ("get", "/v1/customers/{customer}/balance_transactions"),
)
FIXTURE_OBJECTS = ("charge", "refund", "customer", "customer_balance_transaction")
_REF_PREFIX = "#/components/schemas/"


def git(git_dir: str, *args: str) -> str:
    return subprocess.run(
        ["git", f"--git-dir={git_dir}", *args], check=True, capture_output=True, text=True
    ).stdout


def readable(git_dir: str, commit: str, path: str) -> bool:
    return (
        subprocess.run(
            ["git", f"--git-dir={git_dir}", "cat-file", "-e", f"{commit}:{path}"], capture_output=True
        ).returncode
        == 0
    )


def newest_readable(git_dir: str, path: str) -> str:
    for commit in git(git_dir, "rev-list", "HEAD", "--", path).split():
        if readable(git_dir, commit, path):
            return commit
    raise SystemExit(f"no commit in {git_dir} has a readable {path}")


def commit_info(git_dir: str, commit: str) -> dict[str, str]:
    sha, date = git(git_dir, "log", "-1", "--format=%H %cI", commit).split()
    return {"commit": sha, "commit_date": date}


def stub(name: str) -> dict[str, Any]:
    return {
        "not": {},
        "x-trimmed": f"{_REF_PREFIX}{name}: not served by the simulator (add it to KEEP in "
        "scripts/trim_stripe_schemas.py before serving it)",
    }


def trim_refs(node: Any) -> Any:
    """A copy in which every ``$ref`` outside KEEP is a stub that rejects any value."""
    if isinstance(node, list):
        return [trim_refs(item) for item in node]
    if not isinstance(node, dict):
        return node
    ref = node.get("$ref")
    if isinstance(ref, str) and ref.startswith(_REF_PREFIX) and ref[len(_REF_PREFIX) :] not in KEEP:
        return stub(ref[len(_REF_PREFIX) :])
    return {key: trim_refs(value) for key, value in node.items()}


def trimmed_schemas(spec: dict[str, Any]) -> dict[str, Any]:
    schemas = spec["components"]["schemas"]
    kept = {name: trim_refs(schemas[name]) for name in KEEP}
    for name, (path, method) in LISTS.items():
        response = spec["paths"][path][method]["responses"]["200"]["content"]["application/json"]
        kept[name] = {**trim_refs(response["schema"]), "x-source-path": f"paths.{path}.{method}.200"}
    return kept


def without_descriptions(node: Any) -> Any:
    """A copy without the prose (``description`` annotations), which is most of a request body's size;
    a *parameter* named ``description`` is kept."""
    if isinstance(node, list):
        return [without_descriptions(item) for item in node]
    if not isinstance(node, dict):
        return node
    kept: dict[str, Any] = {}
    for key, value in node.items():
        if key == "properties":
            kept[key] = {name: without_descriptions(schema) for name, schema in value.items()}
        elif not (key == "description" and isinstance(value, str)):
            kept[key] = without_descriptions(value)
    return kept


def operation_parameters(spec: dict[str, Any]) -> dict[str, Any]:
    """``"POST /v1/charges": {"body": <form schema>}``, ``"GET /v1/charges": {"query": {name: schema}}``."""
    kept: dict[str, Any] = {}
    for method, path in OPERATIONS:
        operation = spec["paths"][path][method]
        if method == "post":
            body = operation["requestBody"]["content"]["application/x-www-form-urlencoded"]["schema"]
            kept[f"POST {path}"] = {"body": without_descriptions(trim_refs(body))}
        else:
            query = {
                parameter["name"]: without_descriptions(trim_refs(parameter["schema"]))
                for parameter in operation["parameters"]
                if parameter["in"] == "query"
            }
            kept[f"GET {path}"] = {"query": query}
    return kept


def fixture_fields(fixtures: dict[str, Any]) -> dict[str, list[str]]:
    return {name: sorted(fixtures["resources"][name]) for name in FIXTURE_OBJECTS}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--git-dir", required=True, help="the .git directory of a stripe/openapi clone")
    parser.add_argument("--commit", help=f"default: the newest commit with a readable {SPEC_PATH}")
    parser.add_argument("--fixtures-commit", default="HEAD")
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args(argv)

    commit = args.commit or newest_readable(args.git_dir, SPEC_PATH)
    head = commit_info(args.git_dir, "HEAD")
    selected = (
        "given with --commit"
        if args.commit
        else f"the newest commit whose {SPEC_PATH} blob was readable in the clone used "
        f"(its HEAD: {head['commit']}, {head['commit_date']})"
    )
    spec = json.loads(git(args.git_dir, "show", f"{commit}:{SPEC_PATH}"))
    fixtures_commit = git(args.git_dir, "rev-parse", args.fixtures_commit).strip()
    fixtures = json.loads(git(args.git_dir, "show", f"{fixtures_commit}:{FIXTURES_PATH}"))
    document = {
        "x-source": {
            "repository": REPOSITORY,
            "path": SPEC_PATH,
            **commit_info(args.git_dir, commit),
            "selected": selected,
            "api_version": spec["info"]["version"],
            "trimmed_on": dt.date.today().isoformat(),
            "trimmed_by": "scripts/trim_stripe_schemas.py",
            "kept": [*KEEP, *LISTS],
            "note": "Stripe's OpenAPI 3.0 text, unchanged but for $refs outside 'kept', replaced by "
            "stubs that reject any value. Only this trimmed copy is committed.",
        },
        "x-current-fixtures": {
            "repository": REPOSITORY,
            "path": FIXTURES_PATH,
            **commit_info(args.git_dir, fixtures_commit),
            "fields": fixture_fields(fixtures),
        },
        "components": {"schemas": trimmed_schemas(spec)},
        "x-operations": operation_parameters(spec),
    }
    args.out.write_text(json.dumps(document, indent=1, sort_keys=True) + "\n", encoding="utf-8")
    print(f"wrote {args.out} from {REPOSITORY} {SPEC_PATH} at {commit}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
