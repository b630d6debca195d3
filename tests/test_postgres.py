"""The whole system on Postgres: Dagster's storage and our tables in one real database."""

from __future__ import annotations

import json
import os
from pathlib import Path

import psycopg2
import pytest

from tests.support.homes import shipped_home

from .conftest import job_cli

pytestmark = pytest.mark.postgres


def test_batch_runs_on_postgres_with_every_table_in_one_database(pg_database: str, tmp_path: Path) -> None:
    home = shipped_home(tmp_path, "postgres", name="pg_home")
    env = {**os.environ, "DAGSTER_HOME": str(home), "DAGSTER_PG_URL": pg_database}
    run = job_cli("run", "--id", "pg", "--size", "200", env=env)
    assert run.returncode == 0, run.stderr
    status = json.loads(job_cli("status", "--id", "pg", "--json", env=env).stdout)
    assert status["status"] == "succeeded" and all(s["executions"] == 1 for s in status["steps"])
    assert job_cli("resume", "--id", "pg", env=env).returncode == 0
    with psycopg2.connect(pg_database) as conn, conn.cursor() as cur:
        cur.execute("SELECT tablename FROM pg_tables WHERE schemaname='public'")
        tables = {r[0] for r in cur.fetchall()}
        cur.execute(
            "SELECT count(*) FROM durable_idempotency WHERE scope='refund' AND recovery_point='finished'"
        )
        refunds = cur.fetchone()[0]
    assert {"runs", "event_logs", "durable_idempotency", "durable_leases"} <= tables
    assert refunds > 0
    assert not (home / "durable.db").exists()  # no second database beside Postgres
