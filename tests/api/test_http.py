"""The HTTP contract of `job serve` (docs/contract.md) against a real server: auth, 404, 422, shapes."""

from __future__ import annotations

import json
from typing import Any

import anyio
import httpx
import pytest

from tests.api.conftest import FINISHED_BY_JOB, Served
from tests.api.helpers import TOKEN, read_stream
from tests.crash.helpers import instance_reader


def _routes(served: Served) -> list[tuple[str, str]]:
    """Every (method, concrete path) of /openapi.json, so a new route is covered by being documented."""
    doc = httpx.get(f"{served.url}/openapi.json", headers=served.auth, timeout=30).json()
    return [
        (method.upper(), path.replace("{id}", served.batch_id).replace("{name}", "quarantine.csv"))
        for path, item in doc["paths"].items()
        for method in item
    ]


def test_a_batch_file_is_served_as_its_status_names_it(served: Served) -> None:
    status = httpx.get(f"{served.url}/runs/{served.batch_id}", headers=served.auth, timeout=30).json()
    files = {f["name"]: f for f in status["files"]}
    assert set(files) == {"quarantine.csv", "refund_report.csv"}
    local = served.home / "batches" / served.batch_id / "refund_report.csv"  # the SQLite home: files
    assert files["refund_report.csv"]["uri"] == str(local)
    got = httpx.get(f"{served.url}/runs/{served.batch_id}/files/refund_report.csv", headers=served.auth)
    assert got.status_code == 200 and got.content == local.read_bytes()
    assert got.headers["content-type"].startswith("text/csv")


def test_healthz_needs_no_token(served: Served) -> None:
    response = httpx.get(f"{served.url}/healthz", timeout=30)
    assert response.status_code == 200 and response.json() == {"status": "ok"}


def test_every_route_but_healthz_is_401_without_the_token_and_served_with_it(served: Served) -> None:
    routes = _routes(served)
    assert {path for _, path in routes} >= {
        "/healthz",
        "/runs",
        f"/runs/{served.batch_id}",
        f"/runs/{served.batch_id}/events",
        f"/runs/{served.batch_id}/cancel",
        "/metrics",
        "/openapi.json",
    }
    wrong = [
        {},
        {"Authorization": "Bearer nope"},
        {"Authorization": "test-token-Zq9"},
        {"Authorization": "Basic x"},
    ]
    with httpx.Client(timeout=30) as client:
        for method, path in routes:
            if path == "/healthz":
                continue
            for headers in wrong:
                response = client.request(method, f"{served.url}{path}", headers=headers)
                assert response.status_code == 401, (method, path, headers, response.text)
                assert response.json()["error"] == "unauthorized"
                assert response.headers["www-authenticate"].startswith("Bearer")
            ok = client.request(method, f"{served.url}{path}", headers=served.auth)
            assert ok.status_code in (200, 202), (method, path, ok.text)
        # Also a path that is no route: the token is checked before anything is revealed.
        assert client.get(f"{served.url}/nowhere").status_code == 401
        assert client.get(f"{served.url}/nowhere", headers=served.auth).status_code == 404


def test_two_authorization_headers_are_400_whichever_comes_first(served: Served) -> None:
    """Issue #34: the first of two headers used to win (valid then wrong: 200; wrong then valid:
    401). Which one a proxy on the way reads is not defined, so both orders are refused, as the
    simulator refuses them; the event stream's query token does not rescue such a request."""
    valid = served.auth["Authorization"]
    pairs = [(valid, "Bearer nope"), ("Bearer nope", valid), (valid, valid)]
    with httpx.Client(timeout=30) as client:
        for method, path in _routes(served):
            for first, second in pairs:
                headers = [("Authorization", first), ("Authorization", second)]
                response = client.request(method, f"{served.url}{path}", headers=headers)
                if path == "/healthz":  # never reads the header
                    assert response.status_code == 200, response.text
                    continue
                assert response.status_code == 400, (method, path, first, second, response.text)
                body = response.json()
                assert body["error"] == "invalid_request" and "more than one Authorization" in body["message"]
        events = f"{served.url}/runs/{served.batch_id}/events?access_token={TOKEN}"
        doubled = client.get(events, headers=[("Authorization", valid), ("Authorization", valid)])
        assert doubled.status_code == 400, doubled.text
        assert client.get(f"{served.url}/runs", headers=served.auth).status_code == 200  # one is fine


@pytest.mark.parametrize("job_name", list(FINISHED_BY_JOB))
def test_status_is_the_json_of_job_status(served: Served, job_name: str) -> None:
    batch_id = served.batches[job_name]
    with instance_reader(served.home) as reader:
        expected = json.loads(json.dumps(reader.status(batch_id)))
    got = httpx.get(f"{served.url}/runs/{batch_id}", headers=served.auth, timeout=30).json()
    assert got == expected and got["status"] == "succeeded" and got["percent_complete"] == 100.0
    assert got["job"] == job_name and len(got["steps"]) == 7
    listed = httpx.get(f"{served.url}/runs", headers=served.auth, timeout=30).json()
    mine = [b for b in listed if b["id"] == batch_id]
    assert mine == [{k: v for k, v in expected.items() if k not in ("steps", "decisions")}]
    of_job = httpx.get(f"{served.url}/runs", params={"job": job_name}, headers=served.auth, timeout=30)
    assert [b["id"] for b in of_job.json()] == [b["id"] for b in listed if b["job"] == job_name] == [batch_id]
    unknown = httpx.get(f"{served.url}/runs", params={"job": "nope"}, headers=served.auth, timeout=30)
    assert unknown.status_code == 422 and job_name in unknown.json()["message"], unknown.text


def test_runs_are_paged_with_a_link_to_the_next_page(served: Served) -> None:
    with httpx.Client(timeout=30, headers=served.auth) as client:
        first = client.get(f"{served.url}/runs", params={"limit": 1})
        assert first.status_code == 200 and len(first.json()) == 1
        newest = first.json()[0]["id"]
        assert first.links["next"]["url"] == f"/runs?limit=1&before={newest}", first.headers
        rest = client.get(f"{served.url}{first.links['next']['url']}")
        assert rest.status_code == 200 and newest not in [b["id"] for b in rest.json()]
        assert {newest, *(b["id"] for b in rest.json())} == set(served.batches.values())
        assert "link" not in rest.headers
        for bad in ({"limit": "0"}, {"limit": "x"}, {"limit": "1001"}):
            answer = client.get(f"{served.url}/runs", params=bad)
            assert answer.status_code == 422, (bad, answer.text)
            assert answer.json()["error"] == "invalid_request", (bad, answer.text)
        unknown = client.get(f"{served.url}/runs", params={"before": "no-such-batch"})
        assert unknown.status_code == 404 and unknown.json()["error"] == "unknown_batch", unknown.text


@pytest.mark.parametrize("suffix", ["", "/events", "/cancel"])
def test_unknown_batch_is_404_and_malformed_id_is_422(served: Served, suffix: str) -> None:
    method = "POST" if suffix == "/cancel" else "GET"
    with httpx.Client(timeout=30, headers=served.auth) as client:
        unknown = client.request(method, f"{served.url}/runs/no-such-batch{suffix}")
        assert unknown.status_code == 404 and unknown.json()["error"] == "unknown_batch"
        for bad in ["-starts-with-dash", "x" * 65, "sp%20ace", "semi;colon", "%C3%A9t%C3%A9"]:
            response = client.request(method, f"{served.url}/runs/{bad}{suffix}")
            assert response.status_code == 422, (bad, response.text)
            assert response.json()["error"] == "invalid_batch_id"


def test_malformed_last_event_id_is_422(served: Served) -> None:
    response = httpx.get(
        f"{served.url}/runs/{served.batch_id}/events",
        headers={**served.auth, "Last-Event-ID": "abc"},
        timeout=30,
    )
    assert response.status_code == 422 and response.json()["error"] == "invalid_request"


@pytest.mark.parametrize("job_name", list(FINISHED_BY_JOB))
def test_a_finished_batch_replays_its_history_and_closes(served: Served, job_name: str) -> None:
    batch_id = served.batches[job_name]
    stream = read_stream(f"{served.url}/runs/{batch_id}/events", headers=served.auth, timeout=60)
    assert stream.ended and stream.events[-1].event == "status"
    assert stream.events[-1].data["status"] == "succeeded"
    ids = [e.id for e in stream.events]
    assert ids == sorted(set(ids))
    # Resuming in the middle gives exactly the rest.
    middle = len(stream.events) // 2
    rest = read_stream(
        f"{served.url}/runs/{batch_id}/events",
        headers=served.auth,
        last_event_id=stream.events[middle].id,
        timeout=60,
    )
    assert [(e.id, e.data) for e in rest.events] == [(e.id, e.data) for e in stream.events[middle + 1 :]]


def test_cancel_of_a_finished_batch_is_accepted_and_changes_nothing(served: Served) -> None:
    response = httpx.post(f"{served.url}/runs/{served.batch_id}/cancel", headers=served.auth, timeout=30)
    assert response.status_code == 202
    assert response.json() == {"id": served.batch_id, "result": "already finished"}


def test_openapi_is_an_openapi_3_document_with_bearer_auth(served: Served) -> None:
    doc: dict[str, Any] = httpx.get(f"{served.url}/openapi.json", headers=served.auth, timeout=30).json()
    assert doc["openapi"].startswith("3.")
    assert doc["components"]["securitySchemes"]["bearerAuth"] == {"type": "http", "scheme": "bearer"}
    assert doc["paths"]["/healthz"]["get"]["security"] == []
    assert "BatchStatus" in doc["components"]["schemas"]


def test_unexpected_errors_are_500_json_without_a_traceback(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    from durable_assets.ops import api

    def boom(*_args: Any, **_kwargs: Any) -> Any:
        raise RuntimeError("secret internal detail")

    monkeypatch.setattr(api, "list_batches", boom)
    app = api.create_app(instance=None)  # type: ignore[arg-type]

    async def get() -> httpx.Response:
        transport = httpx.ASGITransport(app=app, raise_app_exceptions=False)
        async with httpx.AsyncClient(transport=transport, base_url="http://api") as client:
            return await client.get("/runs")

    response = anyio.run(get)
    assert response.status_code == 500
    assert response.json() == {
        "error": "internal_error",
        "message": "unexpected server error; the server log has the details",
    }
    assert "secret" not in response.text and "Traceback" not in response.text
    assert any("secret internal detail" in str(r.exc_info) for r in caplog.records if r.exc_info)


def test_metrics_parse_as_prometheus_text_and_count_the_finished_batch(served: Served) -> None:
    from prometheus_client.parser import text_string_to_metric_families

    from tests.crash.helpers import Expected
    from tests.support.credits import expected_balances

    response = httpx.get(f"{served.url}/metrics", headers=served.auth, timeout=30)
    assert response.status_code == 200 and response.headers["content-type"].startswith("text/plain")
    samples = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(response.text)
        for s in family.samples
    }
    refunds = Expected.of(served.batch_id, 20).n
    assert samples[("durable_batches", (("status", "succeeded"),))] >= 1
    assert samples[("durable_effects_created_total", (("scope", "refund"),))] == refunds
    assert samples[("durable_effects_requested_total", (("scope", "refund"),))] == refunds
    assert samples[("durable_effects_held_for_review_total", (("scope", "refund"),))] == 0
    # The credit migration's scopes are counted the same way, with no change to the metrics code.
    targets = expected_balances([(served.batches["credit_migration"], 20)])
    assert samples[("durable_effects_created_total", (("scope", "customer"),))] == len(targets)
    moved = sum(1 for t in targets.values() if t.balance_cents != 0)
    assert samples[("durable_effects_created_total", (("scope", "balance"),))] == moved
    assert samples[("durable_lease_expiries_total", ())] == 0
