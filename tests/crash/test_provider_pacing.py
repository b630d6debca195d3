"""Real `job run` processes against a provider that rate-limits or is down (issue #14, defects 2 and 8).

The simulator runs in a thread of the test process, so its counters are the truth about what the
worker sent. SQLite instances only: what is under test is the client's pacing, not the storage.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.support.homes import make_home
from tests.support.machine import scaled
from tests.support.network import free_port
from tests.support.polling import wait_until

from .helpers import (
    EXIT_FAILED,
    EXIT_OK,
    EXIT_USAGE,
    Expected,
    JobProcess,
    Simulator,
    assert_refunded_exactly_once,
    instance_reader,
    job,
    job_env,
    notices_for,
)

pytestmark = pytest.mark.slow


def test_default_settings_get_past_a_rate_limiting_provider(
    tmp_path: Path, simulator: Callable[..., Simulator]
) -> None:
    """Provider at 50 req/s, no DURABLE_RATE_LIMIT: the batch succeeds, every refund exactly once.

    Every provider call site of a batch runs into the limit here: charge creation (step 1), refunds
    and reconciliation's listing of each refunded charge (which the duplicate-refund check reads).
    Before the shared adaptive limit, 16 threads retried each on their own, wasting requests on
    429s and giving up after 8.
    """
    home = make_home(tmp_path)
    batch, size = "paced", 600
    expected = Expected.of(batch, size)
    sim = simulator(rate_limit=50)
    verdicts = _count_verdicts(sim)
    env = job_env(home, payments_url=sim.url)
    run = job(["run", "--id", batch, "--size", str(size)], env, tmp_path, timeout=240)
    assert run.proc.returncode == EXIT_OK, run.tail()

    sim.configure(rate_limit=None)  # the test's own reads are not limited
    assert sim.stats()["refunds_created"] == expected.n
    assert_refunded_exactly_once(sim.refunds(), expected)
    assert notices_for(home, expected) == expected.n
    with instance_reader(home) as reader:
        status = reader.status(batch)
        assert status is not None and status["status"] == "succeeded", status
        checks = _check_results(reader, status["run_ids"][-1])
    assert checks and all(checks.values()), checks
    # Paced as one: the limit bit, and few requests were wasted on 429s (each thread on its own
    # wasted ~40% of its requests).
    assert verdicts["limited"] > 0, verdicts
    assert verdicts["limited"] <= 0.1 * verdicts["admitted"], verdicts


def _count_verdicts(sim: Simulator) -> dict[str, int]:
    """Counts the simulator's rate-limit verdicts (its stats count only refund requests)."""
    counts = {"admitted": 0, "limited": 0}
    admit = sim.server.admit

    def counting() -> float | None:
        wait = admit()
        counts["limited" if wait is not None else "admitted"] += 1
        return wait

    sim.server.admit = counting  # type: ignore[method-assign]
    return counts


def _check_results(reader: Any, run_id: str) -> dict[str, bool]:
    """Every asset check's outcome in the run (the money checks talk to the provider too)."""
    from dagster import DagsterEventType

    records = reader.instance.get_records_for_run(
        run_id, of_type=DagsterEventType.ASSET_CHECK_EVALUATION
    ).records
    out: dict[str, bool] = {}
    for record in records:
        evaluation = record.event_log_entry.dagster_event.event_specific_data
        out[evaluation.check_name] = bool(evaluation.passed)
    return out


@pytest.mark.parametrize("provider", ["error_rate_1", "nobody_listens"])
def test_provider_down_fails_within_the_budget(
    tmp_path: Path, simulator: Callable[..., Simulator], provider: str
) -> None:
    """A provider that starts answering only faults (or nothing at all) once the batch runs fails it
    within DURABLE_PROVIDER_DOWN_BUDGET_S plus slack, with one error that names the setting. (Down
    before the batch exists, it is exit 2 at `job run`: the provider's account is asked first.)"""
    budget_s = 4.0
    home = make_home(tmp_path)
    if provider == "nobody_listens":
        # Nobody listens before the batch exists: asked for its account first, exit 2, no batch.
        env = job_env(home, payments_url=f"http://127.0.0.1:{free_port()}")
        refused = job(["run", "--id", "down", "--size", "50"], env, tmp_path, timeout=120)
        assert refused.proc.returncode == EXIT_USAGE, refused.tail()
        assert "DURABLE_PAYMENTS_URL" in refused.stderr, refused.tail()
        with instance_reader(home) as reader:
            assert not reader.has_runs("down")
        return
    sim = simulator()
    env = job_env(home, payments_url=sim.url, DURABLE_PROVIDER_DOWN_BUDGET_S=budget_s)
    started = time.monotonic()
    worker = JobProcess(["run", "--id", "down", "--size", "50"], env, tmp_path)
    with instance_reader(home) as reader:
        # The account was asked before the run was created; the provider goes down as the run starts.
        wait_until(lambda: reader.has_runs("down") or not worker.alive(), 120, interval=0.01, what="the run")
    sim.configure(error_rate=1.0)
    worker.wait(300)
    run = worker
    elapsed = time.monotonic() - started
    assert run.proc.returncode == EXIT_FAILED, run.tail()
    # The process as a whole: Dagster's start-up and bookkeeping cost tens of seconds on a loaded
    # 2-core machine (before the budget, 16 threads x 8 attempts x 4 step attempts took ~465 s).
    assert elapsed < budget_s + scaled(120), f"took {elapsed:.1f} s\n{run.tail()}"
    with instance_reader(home) as reader:
        status = reader.status("down")
        assert status is not None and status["status"] == "failed", status
        events = _step_events(reader, status["run_ids"][-1])
    failures = [text for kind, _, text in events if kind == "STEP_FAILURE"]
    assert len(failures) == 1, events  # the step's RetryPolicy does not wait the budget again
    assert "DURABLE_PROVIDER_DOWN_BUDGET_S" in failures[0], failures
    assert "DURABLE_PROVIDER_DOWN_BUDGET_S" in run.stderr, run.tail()
    # The step itself, from its own events: the budget, plus a request and a backoff's rounding.
    (start,) = [at for kind, at, _ in events if kind == "STEP_START"]
    (end,) = [at for kind, at, _ in events if kind == "STEP_FAILURE"]
    assert budget_s <= end - start < budget_s + 5, (start, end)


def _step_events(reader: Any, run_id: str) -> list[tuple[str, float, str]]:
    """(event type, timestamp, failure text) of the run's step starts and failures."""
    from dagster import DagsterEventType

    out: list[tuple[str, float, str]] = []
    for kind in (DagsterEventType.STEP_START, DagsterEventType.STEP_FAILURE):
        for record in reader.instance.get_records_for_run(run_id, of_type=kind).records:
            entry = record.event_log_entry
            data = entry.dagster_event.event_specific_data
            text = str(data.error_display_string) if kind == DagsterEventType.STEP_FAILURE else ""
            out.append((kind.value, entry.timestamp, text))
    return out
