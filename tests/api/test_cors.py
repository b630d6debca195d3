"""Issue #15, item 5: a dashboard on another origin reads the status API and its event stream.

A real `job serve` with a token and two allowed origins (one from DURABLE_API_CORS_ORIGINS, one
from `--cors-origin`); pages are served from other 127.0.0.1 ports, which are other origins. The
protocol-level checks use httpx; the last test is Debian's Chromium (never a downloaded browser)
running a page's fetch and EventSource, from an allowed origin and from one that is not.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import pytest

from durable_assets.errors import UsageError
from durable_assets.ops.api import ApiSettings
from tests.api.helpers import TOKEN, ApiServer, read_stream
from tests.crash.helpers import job, job_env
from tests.support.browser import headless_chromium
from tests.support.homes import make_home
from tests.support.machine import scaled
from tests.support.polling import wait_until

BATCH = "cors-1"

PAGE = """<!doctype html>
<meta charset="utf-8"><title>dashboard</title>
<script>
const api = new URLSearchParams(location.search).get("api");
const token = new URLSearchParams(location.search).get("token");
const batch = new URLSearchParams(location.search).get("batch");
window.result = {runs: null, fetchError: null, events: [], streamError: null, closed: false};
fetch(`${api}/runs`, {headers: {Authorization: `Bearer ${token}`}})
  .then(r => r.json()).then(j => { window.result.runs = j; })
  .catch(e => { window.result.fetchError = String(e); });
const source = new EventSource(`${api}/runs/${batch}/events?access_token=${encodeURIComponent(token)}`);
for (const kind of ["progress", "step", "status"]) {
  source.addEventListener(kind, e => {
    window.result.events.push({id: e.lastEventId, event: kind, data: JSON.parse(e.data)});
  });
}
source.onerror = () => {
  // After the last event the server ends the stream; the reconnect (with Last-Event-ID) is
  // answered 204, which closes the EventSource for good. A CORS refusal closes it at once.
  if (source.readyState === EventSource.CLOSED) { window.result.closed = true; }
  if (window.result.events.length === 0) { window.result.streamError = "no events"; }
};
</script>
"""


class _Page(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        body = PAGE.encode()
        self.send_response(200)
        self.send_header("Content-Type", "text/html; charset=utf-8")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *_args: Any) -> None:
        pass


@dataclass
class Origin:
    server: ThreadingHTTPServer

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}"


@dataclass
class Setup:
    api: ApiServer
    env_origin: Origin
    flag_origin: Origin
    other_origin: Origin

    @property
    def url(self) -> str:
        return self.api.url


def _origin() -> Origin:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Page)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return Origin(server)


@pytest.fixture(scope="module")
def setup(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Setup]:
    root = tmp_path_factory.mktemp("cors")
    home = make_home(root)
    env_origin, flag_origin, other_origin = _origin(), _origin(), _origin()
    env = job_env(home, DURABLE_API_TOKEN=TOKEN, DURABLE_API_CORS_ORIGINS=f" {env_origin.url}/ ,")
    batch = job(["run", "--id", BATCH, "--size", "20"], env, root)
    assert batch.proc.returncode == 0, batch.tail()
    api = ApiServer(env, root, ["--cors-origin", flag_origin.url])
    try:
        wait_until(lambda: _answers(api.url), 30, interval=0.2, what="`job serve` to answer")
        yield Setup(api, env_origin, flag_origin, other_origin)
    finally:
        api.close()
        for origin in (env_origin, flag_origin, other_origin):
            origin.server.shutdown()
            origin.server.server_close()


def _answers(url: str) -> bool:
    try:
        return httpx.get(f"{url}/healthz", timeout=5).status_code == 200
    except httpx.TransportError:
        return False


def _preflight(url: str, origin: str, method: str = "GET") -> httpx.Response:
    return httpx.options(
        url,
        headers={
            "Origin": origin,
            "Access-Control-Request-Method": method,
            "Access-Control-Request-Headers": "authorization,last-event-id",
        },
        timeout=30,
    )


# --- settings ------------------------------------------------------------------------------------


def test_origins_come_from_the_variable_and_the_flag_and_are_checked() -> None:
    settings = ApiSettings.from_env(
        {"DURABLE_API_CORS_ORIGINS": "https://a.example, http://127.0.0.1:8080/"},
        cors_origins=["https://b.example:8443", "https://a.example"],
    )
    assert settings.cors_origins == ("https://a.example", "http://127.0.0.1:8080", "https://b.example:8443")
    assert ApiSettings.from_env({}).cors_origins == ()  # off by default
    for bad in ["*", "a.example", "https://a.example/path", "ftp://a.example", "https://"]:
        with pytest.raises(UsageError, match="not an origin"):
            ApiSettings.from_env({"DURABLE_API_CORS_ORIGINS": bad})


def test_a_bad_origin_or_cap_is_a_usage_error_of_job_serve(tmp_path: Path) -> None:
    from tests.conftest import job_cli

    env = job_env(make_home(tmp_path))
    bad_origin = job_cli("serve", "--port", "0", "--cors-origin", "*", env=env, timeout=60)
    assert bad_origin.returncode == 2 and "not an origin" in bad_origin.stderr, bad_origin.stderr
    bad_cap = job_cli("serve", "--port", "0", env={**env, "DURABLE_API_MAX_STREAMS": "0"}, timeout=60)
    assert bad_cap.returncode == 2 and "DURABLE_API_MAX_STREAMS" in bad_cap.stderr, bad_cap.stderr


# --- the protocol, with httpx --------------------------------------------------------------------


@pytest.mark.parametrize("which", ["env_origin", "flag_origin"])
def test_a_preflight_from_an_allowed_origin_needs_no_token(setup: Setup, which: str) -> None:
    origin = getattr(setup, which).url
    for path, method in [
        (f"/runs/{BATCH}/events", "GET"),
        ("/runs", "GET"),
        (f"/runs/{BATCH}/cancel", "POST"),
    ]:
        response = _preflight(f"{setup.url}{path}", origin, method)
        assert response.status_code == 200, (path, response.status_code, response.text)
        assert response.headers["access-control-allow-origin"] == origin
        assert method in response.headers["access-control-allow-methods"]
        allowed = response.headers["access-control-allow-headers"].lower()
        assert "authorization" in allowed and "last-event-id" in allowed
        assert "access-control-allow-credentials" not in response.headers  # bearer, not cookies


def test_actual_requests_still_need_the_token_and_carry_cors_headers(setup: Setup) -> None:
    origin = setup.flag_origin.url
    with httpx.Client(timeout=30, headers={"Origin": origin}) as client:
        denied = client.get(f"{setup.url}/runs")
        assert denied.status_code == 401
        assert denied.headers["access-control-allow-origin"] == origin  # the page can see why
        ok = client.get(f"{setup.url}/runs", headers={"Authorization": f"Bearer {TOKEN}"})
        assert ok.status_code == 200 and ok.headers["access-control-allow-origin"] == origin
        assert [b["id"] for b in ok.json()] == [BATCH]


def _cors_headers(response: httpx.Response) -> list[str]:
    return [name for name in response.headers if name.lower().startswith("access-control-")]


def test_a_non_allowed_origin_gets_no_cors_headers(setup: Setup) -> None:
    origin = setup.other_origin.url
    for path, method in [
        ("/runs", "GET"),
        (f"/runs/{BATCH}/events", "GET"),
        (f"/runs/{BATCH}/cancel", "POST"),
    ]:
        preflight = _preflight(f"{setup.url}{path}", origin, method)
        assert preflight.status_code != 200, path
        # Not even the allowed methods, headers or max-age: a refusal tells the page nothing.
        assert _cors_headers(preflight) == [], (path, dict(preflight.headers))
    allowed = _preflight(f"{setup.url}/runs", setup.flag_origin.url)  # the same request, allowed
    assert allowed.status_code == 200 and len(_cors_headers(allowed)) >= 3, dict(allowed.headers)
    with httpx.Client(timeout=30, headers={"Origin": origin, "Authorization": f"Bearer {TOKEN}"}) as client:
        response = client.get(f"{setup.url}/runs")
        assert response.status_code == 200  # not a browser: CORS protects users, not the server
        assert "access-control-allow-origin" not in response.headers


def test_the_event_stream_takes_the_token_from_the_query_and_no_other_route_does(setup: Setup) -> None:
    url = f"{setup.url}/runs/{BATCH}/events"
    stream = read_stream(f"{url}?access_token={TOKEN}", timeout=60)
    assert stream.status_code == 200 and stream.ended
    assert stream.events[-1].event == "status" and stream.events[-1].data["status"] == "succeeded"
    assert read_stream(f"{url}?access_token=wrong", timeout=30).status_code == 401
    # A header is judged alone: a wrong header with a right query token is refused.
    mixed = read_stream(f"{url}?access_token={TOKEN}", headers={"Authorization": "Bearer x"}, timeout=30)
    assert mixed.status_code == 401
    with httpx.Client(timeout=30) as client:
        assert client.get(f"{setup.url}/runs?access_token={TOKEN}").status_code == 401
        assert client.get(f"{setup.url}/runs/{BATCH}?access_token={TOKEN}").status_code == 401
        assert client.post(f"{url.removesuffix('/events')}/cancel?access_token={TOKEN}").status_code == 401
        assert client.get(f"{setup.url}/healthz?access_token={TOKEN}").status_code == 200
    # The token in the URL never reaches the server's log (uvicorn logs each request's query).
    log = setup.api.proc.stderr + setup.api.proc.stdout
    assert f"/runs/{BATCH}/events" in log and TOKEN not in log


# --- Chromium ------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    with headless_chromium() as b:
        yield b


def _dashboard(browser: Any, page_origin: Origin, setup: Setup) -> tuple[dict[str, Any], list[str]]:
    """Open the dashboard page on ``page_origin``; wait until its stream closed; its result and console."""
    page = browser.new_page()
    console: list[str] = []
    page.on("console", lambda m: console.append(m.text))
    try:
        page.goto(f"{page_origin.url}/?api={setup.url}&token={TOKEN}&batch={BATCH}")
        page.wait_for_function(
            "() => window.result && window.result.closed && (window.result.runs || window.result.fetchError)",
            timeout=scaled(60) * 1000,
        )
        result = page.evaluate("() => window.result")
    finally:
        page.close()
    return json.loads(json.dumps(result)), console


@pytest.mark.slow
def test_chromium_dashboard_on_an_allowed_origin_reads_runs_and_the_event_stream(
    setup: Setup, browser: Any
) -> None:
    start = time.monotonic()
    result, console = _dashboard(browser, setup.flag_origin, setup)
    assert result["fetchError"] is None and [b["id"] for b in result["runs"]] == [BATCH], (result, console)
    events = result["events"]
    assert events and events[-1]["event"] == "status" and events[-1]["data"]["status"] == "succeeded", console
    ids = [int(e["id"]) for e in events]
    assert ids == sorted(set(ids)), "an event arrived twice or out of order (the reconnect resumed wrongly)"
    assert {e["event"] for e in events} >= {"step", "status"}
    print(
        f"\nChromium from {setup.flag_origin.url}: {len(events)} events in {time.monotonic() - start:.1f} s"
    )


@pytest.mark.slow
def test_chromium_dashboard_on_another_origin_is_blocked(setup: Setup, browser: Any) -> None:
    result, console = _dashboard(browser, setup.other_origin, setup)
    assert result["runs"] is None and result["fetchError"], result
    assert result["events"] == [] and result["streamError"], result
    assert any("CORS" in line or "Access-Control-Allow-Origin" in line for line in console), console
