"""The Dagster UI path, driven like a person would: headless Debian Chromium against `dagster dev`.

The real webserver, daemon and code server run on a temporary instance whose dagster.yaml is the
one we ship (lease-aware launcher, run monitoring, run retries). A batch is launched from the
launchpad (adding its partition there), runs to success and is screenshotted; a second batch
fails at its last step and is re-executed from failure through the run page's menu, without any
refund being sent again; a third has its run worker SIGKILLed, and the daemon fails the run and
retries it from failure to success, each refund once at the provider. Screenshots land in
tests/artifacts/ (gitignored); paths are printed.
"""

from __future__ import annotations

import re
import signal
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from durable_assets.payments.store import PaymentStore
from tests.support.browser import chromium_binary, headless_chromium
from tests.support.dagster_dev import UiProcess, graphql
from tests.support.homes import shipped_home
from tests.support.machine import scaled
from tests.support.polling import wait_until

from ..conftest import REPO

pytestmark = pytest.mark.slow

ARTIFACTS = REPO / "tests" / "artifacts"
LOCATION = "durable_assets"
JOB = "refund_batch"
#: Queue pickup + worker start + a 1000-invoice batch on a loaded 2-core machine, with margin.
RUN_DEADLINE_S = 240.0
#: The whole job's graph, every group expanded, no info panel over it (linked from README, docs/ui.md).
JOB_GRAPH = (
    '/asset-groups~job:"refund_batch"?expanded='
    "global@global:ingest,global@global:policy,global@global:payouts,global@global:customers,global@global:reporting"
)
ASSETS = ("invoices", "validated_invoices", "refund_candidates", "issued_refunds")
ASSETS += ("reconciled_refunds", "customer_notices", "batch_report")
#: apt installing chromium on a fresh machine, on a slow mirror.


def _ms(seconds: float) -> float:
    """A playwright timeout (ms) for ``seconds`` on a quiet machine, scaled by this one's slowness."""
    return scaled(seconds) * 1000


@dataclass
class DagsterUi:
    url: str
    home: Path
    log: Path

    def gql(self, query: str, **variables: Any) -> dict[str, Any]:
        return graphql(self.url, query, **variables)

    def run(self, run_id: str) -> dict[str, Any]:
        data = self.gql(
            "query($id: ID!) { runOrError(runId: $id) { ... on Run { runId status parentRunId "
            "tags { key value } stepStats { stepKey status } } } }",
            id=run_id,
        )
        return dict(data["runOrError"])

    def messages(self, run_id: str) -> list[str]:
        """The run's engine and run-level events: why it failed, and what the daemon decided."""
        data = self.gql(
            "query($id: ID!) { logsForRun(runId: $id) { ... on EventConnection { events { __typename "
            "... on MessageEvent { message } } } } }",
            id=run_id,
        )
        events = data["logsForRun"].get("events", [])
        return [
            f"{e['__typename']}: {e.get('message', '')[:300]}"
            for e in events
            if "Step" not in e["__typename"]
        ]

    def wait_for_run(self, run_id: str, *statuses: str) -> dict[str, Any]:
        def finished() -> dict[str, Any] | None:
            run = self.run(run_id)
            if run["status"] in ("SUCCESS", "FAILURE", "CANCELED") and run["status"] not in statuses:
                raise AssertionError(f"run {run_id} ended {run['status']}: {run['stepStats']}\n{self.tail()}")
            return run if run["status"] in statuses else None

        return wait_until(finished, RUN_DEADLINE_S, interval=0.5, what=f"run {run_id} to reach {statuses}")

    def tail(self) -> str:
        return self.log.read_text(errors="replace")[-3000:] if self.log.exists() else ""


@pytest.fixture(scope="module")
def ui(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DagsterUi]:
    chromium_binary()  # before the UI starts: apt may still be installing it
    root = tmp_path_factory.mktemp("ui")
    home = shipped_home(root)  # the config we ship
    log = root / "ui.log"
    process = UiProcess(home, log)  # scripts/ui.sh, as users run it, on a free port
    try:
        process.wait_loaded()
        yield DagsterUi(process.url, home, log)
    finally:
        # The script's own stop: the whole group (code servers, run workers) within 5 s.
        elapsed = process.stop(signal.SIGTERM)
        print(f"scripts/ui.sh stopped, every process gone after {elapsed:.1f} s")


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    with headless_chromium() as b:
        yield b


@pytest.fixture
def page(browser: Any) -> Iterator[Any]:
    context = browser.new_context(viewport={"width": 1440, "height": 900})
    # No localStorage 'communityNux' here: the shipped dagster.yaml (nux.enabled: false) is what
    # keeps Dagster's "Join the Dagster community" dialog from covering the pages we click.
    context.set_default_timeout(_ms(30))
    pg = context.new_page()
    try:
        yield pg
    finally:
        context.close()


def _screenshot(page: Any, name: str) -> Path:
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    path = ARTIFACTS / f"{name}.png"
    page.screenshot(path=str(path), full_page=True)
    print(f"screenshot: {path}")
    return path


def _run_id_from(page: Any) -> str:
    page.wait_for_url(re.compile(r"/runs/[0-9a-f-]{36}"), timeout=_ms(60))
    match = re.search(r"/runs/([0-9a-f-]{36})", page.url)
    assert match, page.url
    return match.group(1)


def launch_batch_from_launchpad(page: Any, ui: DagsterUi, batch_id: str) -> str:
    """Job page → Materialize all ▾ → Open launchpad → Add new partition → Materialize."""
    page.goto(f"{ui.url}/locations/{LOCATION}/jobs/{JOB}")
    materialize_all = page.get_by_role("button", name="Materialize all…")
    materialize_all.wait_for()
    page.locator("button:right-of(:text('Materialize all…'))").first.click()
    page.get_by_role("menuitem", name="Open launchpad").click()
    launchpad = page.get_by_role("dialog").filter(has_text="Launchpad")
    launchpad.get_by_role("button", name="Add new partition").click()
    add = page.get_by_role("dialog").filter(has_text="Add a partition")
    add.get_by_placeholder("name").fill(batch_id)
    add.get_by_role("button", name="Save").click()
    # The new partition is selected, and the default config needs no typing.
    launchpad.get_by_text(f"partition: {batch_id}").wait_for()
    launchpad.get_by_text("No errors").wait_for()
    launchpad.get_by_role("button", name="Materialize").click()
    return _run_id_from(page)


def test_launch_a_batch_from_the_launchpad_and_watch_it_succeed(ui: DagsterUi, page: Any) -> None:
    run_id = launch_batch_from_launchpad(page, ui, "ui-batch")
    run = ui.wait_for_run(run_id, "SUCCESS")
    assert {"key": "dagster/partition", "value": "ui-batch"} in run["tags"]
    assert {s["stepKey"] for s in run["stepStats"] if s["status"] == "SUCCESS"} >= {
        "invoices",
        "issued_refunds",
        "batch_report",
        "reconciled_refunds_no_duplicate_refunds_at_provider",
    }
    page.reload()
    page.get_by_text("Success", exact=True).first.wait_for()
    _screenshot(page, "ui-batch-succeeded")

    # The refund metadata is on the materialization, for this batch's partition.
    page.goto(f"{ui.url}/assets/issued_refunds?partition=ui-batch")
    page.get_by_text("refunds_issued").first.wait_for()
    page.get_by_text("requests_sent").first.wait_for()
    _screenshot(page, "ui-issued-refunds-metadata")

    # The README's link to the graph opens every group: each asset's node is drawn.
    page.goto(ui.url + JOB_GRAPH)
    for asset in ASSETS:
        page.get_by_text(asset, exact=True).first.wait_for()
    _screenshot(page, "ui-job-graph")


def test_a_failed_batch_re_executed_from_failure_in_the_ui_completes(ui: DagsterUi, page: Any) -> None:
    batch = "ui-fix"
    # Deterministic fault after every refund was issued: a directory sits where the report goes.
    blocker = ui.home / "batches" / batch / "refund_report.csv"
    blocker.mkdir(parents=True)
    failed_id = launch_batch_from_launchpad(page, ui, batch)
    failed = ui.wait_for_run(failed_id, "FAILURE")
    steps = {s["stepKey"]: s["status"] for s in failed["stepStats"]}
    assert steps["batch_report"] == "FAILURE" and steps["customer_notices"] == "SUCCESS", steps
    with PaymentStore(str(ui.home / "payments.db")) as store:
        refunds_before = store.stats()["refunds_created"]
    assert refunds_before > 0

    blocker.rmdir()  # the operator fixes the cause...
    page.goto(f"{ui.url}/runs/{failed_id}")
    page.get_by_role("button", name=re.compile("Re-execute all")).wait_for()
    page.locator("button:right-of(:text('Re-execute all'))").first.click()
    page.get_by_role("menuitem", name="From failure").click()  # ...and re-executes from failure
    page.wait_for_url(lambda url: failed_id not in url and "/runs/" in url, timeout=_ms(60))
    retry_id = _run_id_from(page)
    retry = ui.wait_for_run(retry_id, "SUCCESS")

    assert retry["parentRunId"] == failed_id
    executed = {s["stepKey"] for s in retry["stepStats"]}
    assert executed == {"batch_report"}, executed  # committed steps were not run again
    with PaymentStore(str(ui.home / "payments.db")) as store:
        assert store.stats()["refunds_created"] == refunds_before  # no refund sent twice
    assert (ui.home / "batches" / batch / "refund_report.csv").is_file()
    page.reload()
    page.get_by_text("Success", exact=True).first.wait_for()
    _screenshot(page, "ui-reexecuted-from-failure")
