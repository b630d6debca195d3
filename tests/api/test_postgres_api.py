"""`job serve` on a Postgres instance: global storage ids, the same status JSON, exact resume."""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import pytest

from tests.api.helpers import api_server, read_stream
from tests.crash.helpers import job, job_env
from tests.support.homes import shipped_home

pytestmark = [pytest.mark.postgres, pytest.mark.slow]


def test_status_and_events_on_postgres(pg_database: str, tmp_path: Path) -> None:
    home = shipped_home(tmp_path, "postgres", name="pg_home")
    env = job_env(home, DAGSTER_PG_URL=pg_database)
    ran = job(["run", "--id", "pg-api", "--size", "60"], env, tmp_path)
    assert ran.proc.returncode == 0, ran.tail()
    status = json.loads(job(["status", "--id", "pg-api", "--json"], env, tmp_path).stdout)
    with api_server(env, tmp_path) as server:
        assert httpx.get(f"{server.url}/runs/pg-api", timeout=30).json() == status
        url = f"{server.url}/runs/pg-api/events"
        full = read_stream(url, timeout=60)
        assert full.ended and (full.events[-1].event, full.events[-1].data["status"]) == (
            "status",
            "succeeded",
        )
        ids = [e.id for e in full.events]
        assert ids == sorted(set(ids))
        assert {e.event for e in full.events} == {"progress", "step", "status"}
        cut = len(full.events) // 3
        rest = read_stream(url, last_event_id=full.events[cut].id, timeout=60)
        assert [(e.id, e.data) for e in rest.events] == [(e.id, e.data) for e in full.events[cut + 1 :]]
        assert read_stream(url, last_event_id=full.events[-1].id).status_code == 204
