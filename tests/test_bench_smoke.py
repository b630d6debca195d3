"""The benchmark harness still works: scenarios 1-3 at smoke size produce their rows and JSON.

No timing assertions (CI machines are noisy; the numbers are the benchmark's business). What is
asserted is that each scenario ran to a result, and that resume's provider requests equal the
refunds still unconfirmed at the kill, which the harness itself checks against the provider.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.support.machine import FACTOR_ENV, scaled, slowness

REPO = Path(__file__).resolve().parents[1]

pytestmark = pytest.mark.slow


def _bench(tmp_path: Path, only: str, timeout: float) -> tuple[subprocess.CompletedProcess[str], Any]:
    """``python -m bench`` at smoke size in a clean environment; its output and its JSON report.
    ``timeout`` is for a quiet machine (scaled by this one's slowness)."""
    out = tmp_path / "bench.json"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DURABLE_", "DAGSTER_", "STRIPE_"))}
    env["PYTHONPATH"] = str(REPO)
    env[FACTOR_ENV] = f"{slowness():.2f}"  # its own waits (tests/support helpers) follow the machine too
    bench = [sys.executable, "-m", "bench", "--size", "smoke", "--only", only, "--json", str(out)]
    proc = subprocess.run(
        bench, cwd=REPO, env=env, capture_output=True, text=True, timeout=scaled(timeout), check=False
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc, json.loads(out.read_text())


def test_bench_smoke_scenarios_1_to_3(tmp_path: Path) -> None:
    proc, report = _bench(tmp_path, "1,2,3", timeout=240)
    assert report["machine"]["cpu_count"] and report["machine"]["dagster"]
    rows = {r["scenario"]: r for r in report["results"]}
    assert sorted(rows) == [1, 2, 3]
    for r in rows.values():
        assert r["measured"] and "error" not in r, r
        assert f"| {r['scenario']} |" in proc.stdout  # the printed table has its row
    assert rows[1]["exactly_once"] is True
    three = rows[3]
    assert three["resume_provider_requests"] == three["refunds_unconfirmed_at_kill"] > 0
    assert three["resume_new_refunds"] == three["refunds"] - three["refunds_created_before_kill"]
    assert three["steps_reexecuted"] == ["issued_refunds"]


@pytest.mark.full  # two minutes of workers that tests/distributed already prove; the harness runs in --full
def test_bench_smoke_scenario_10_distributed(tmp_path: Path) -> None:
    """Scenario 10 at smoke size: workers, a binding shared limit and the overhead pair all run."""
    from tests.distributed.conftest import broker_available
    from tests.support.homes import postgres_available

    if not (postgres_available() and broker_available()):
        pytest.skip("scenario 10 needs Postgres and RabbitMQ")
    _proc, report = _bench(tmp_path, "10", timeout=600)
    (row,) = report["results"]
    assert row["measured"] and "error" not in row and not row["skipped"], row
    assert row["exactly_once"] is True
    assert set(row["by_workers"]) == {"1", "2", "4"}
    assert row["binding"]["requests"] / row["binding"]["span_s"] <= row["binding_limit"] * 1.01, row
