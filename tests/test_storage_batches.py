"""Batches on shared storage: nothing a batch needs or writes stays in one host's instance folder.

A batch run with ``DURABLE_STORAGE=database`` keeps its step outputs, its stored input and its
files for people in ``durable_blobs``: killed in its first step, its input file deleted and its
instance folder's ``storage`` gone, it still resumes and finishes; its files are named by
``durable://`` URIs in ``job status`` and served by the HTTP API. A batch started on the local
filesystem (before an instance switched storage) still resumes after the switch.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.crash.helpers import job_env
from tests.support.homes import make_home, open_instance

from .conftest import job_cli

HEADER = (
    "invoice_id,customer_id,customer_email,charge_id,currency,amount_charged,contracted_amount,"
    "already_refunded,service_period,charged_at,cancelled_at\n"
)
ROWS = [
    "I1,C1,a@x.com,ch_missing,usd,12.00,10.00,0,2026-10,2026-10-01T00:00:00Z,",  # held: no such charge
    "I2,C2,b@x.com,ch_x,xyz,12.00,10.00,0,2026-10,2026-10-01T00:00:00Z,",  # unknown currency
    "I3,C3,not-an-email,ch_y,usd,-1,10.00,0,2026-10,2026-10-01T00:00:00Z,",  # two reasons
]
EXIT_HELD = 4


def _input(tmp_path: Path) -> Path:
    path = tmp_path / "inv.csv"
    path.write_text(HEADER + "\n".join(ROWS) + "\n")
    return path


def _status(env: dict[str, str], batch_id: str) -> dict[str, object]:
    answer = job_cli("status", "--id", batch_id, "--json", env=env)
    assert answer.returncode == 0, answer.stderr
    return dict(json.loads(answer.stdout))


def _killed_at(env: dict[str, str], point: str, *args: str) -> subprocess.CompletedProcess[str]:
    run = job_cli(*args, env={**env, "DURABLE_CRASH_AT": point})
    assert run.returncode == -9, f"expected a SIGKILL at {point}: {run.returncode}\n{run.stderr[-2000:]}"
    return run


@pytest.mark.slow
def test_a_batch_on_database_storage_resumes_with_nothing_in_its_instance_folder(tmp_path: Path) -> None:
    home = make_home(tmp_path)
    env = job_env(home, DURABLE_STORAGE="database")
    source = _input(tmp_path)
    # Killed as step 2 starts: step 1 read the input and its output is stored.
    _killed_at(env, "step_start:2", "run", "--id", "db1", "--input", str(source))
    source.unlink()  # the batch holds its own copy of the input
    shutil.rmtree(home / "storage", ignore_errors=True)  # and of its outputs
    resumed = job_cli("resume", "--id", "db1", "--wait", "60", env=env)
    assert resumed.returncode == EXIT_HELD, resumed.stderr

    status = _status(env, "db1")
    assert status["status"] == "succeeded"
    files = {f["name"]: f for f in status["files"]}  # type: ignore[attr-defined]
    assert set(files) == {"quarantine.csv", "refund_report.csv"}
    assert files["quarantine.csv"]["uri"] == "durable://batches/db1/quarantine.csv"
    refs = [s["output_ref"] for s in status["steps"]]  # type: ignore[attr-defined]
    assert refs and all(str(r).startswith("durable://outputs/") for r in refs if r is not None)
    assert not (home / "batches").exists()
    # Since the rmtree, only Dagster's compute logs (this host's own log mirror) were written there.
    assert not [p for p in (home / "storage").rglob("*") if p.is_file() and "compute_logs" not in p.parts]
    shown = job_cli("status", "--id", "db1", env=env).stdout
    assert "quarantine: durable://batches/db1/quarantine.csv" in shown

    from starlette.testclient import TestClient

    from durable_assets.ops.api import create_app

    with open_instance(home) as instance, TestClient(create_app(instance)) as client:
        answer = client.get("/runs/db1/files/quarantine.csv")
        assert answer.status_code == 200 and answer.headers["content-type"].startswith("text/csv")
        assert "unknown_currency" in answer.text and "invalid_email" in answer.text
        report = client.get("/runs/db1/files/refund_report.csv")
        assert "I1" in report.text and "held_for_review" in report.text
        missing = client.get("/runs/db1/files/nope.csv")
        assert missing.status_code == 404 and missing.json()["error"] == "unknown_file"
        assert client.get("/runs/nobatch/files/quarantine.csv").status_code == 404


@pytest.mark.slow
def test_a_batch_started_on_local_files_resumes_after_the_switch_to_the_database(tmp_path: Path) -> None:
    home = make_home(tmp_path)
    local = job_env(home)
    # Killed as step 3 starts: steps 1 and 2 wrote their outputs with Dagster's filesystem IO manager.
    _killed_at(local, "step_start:3", "run", "--id", "old1", "--input", str(_input(tmp_path)))
    assert (home / "storage").is_dir()
    switched = job_env(home, DURABLE_STORAGE="database")
    resumed = job_cli("resume", "--id", "old1", "--wait", "60", env=switched)
    assert resumed.returncode == EXIT_HELD, resumed.stderr
    status = _status(switched, "old1")
    assert status["status"] == "succeeded"
    assert [s["executions"] for s in status["steps"]][:2] == [1, 1]  # type: ignore[index]
    files = {f["name"]: f["uri"] for f in status["files"]}  # type: ignore[attr-defined]
    # Written before the switch, and after it:
    assert files["quarantine.csv"] == str(home / "batches" / "old1" / "quarantine.csv")
    assert files["refund_report.csv"] == "durable://batches/old1/refund_report.csv"


@pytest.mark.postgres
def test_the_postgres_home_keeps_outputs_and_files_in_its_database(tmp_path: Path, pg_database: str) -> None:
    from tests.support.homes import shipped_home

    home = shipped_home(tmp_path, "postgres", name="pg_home")
    env = job_env(home, DAGSTER_PG_URL=pg_database)  # DURABLE_STORAGE unset: auto is the database
    run = job_cli("run", "--id", "pg1", "--input", str(_input(tmp_path)), env=env)
    assert run.returncode == EXIT_HELD, run.stderr
    status = _status(env, "pg1")
    uris = sorted(f["uri"] for f in status["files"])  # type: ignore[attr-defined]
    assert uris == ["durable://batches/pg1/quarantine.csv", "durable://batches/pg1/refund_report.csv"]
    assert not (home / "batches").exists()
    # Dagster's compute logs stay in the host's folder (for people); no output or file of the batch does.
    assert not [p for p in (home / "storage").rglob("*") if p.is_file() and "compute_logs" not in p.parts]
