"""Shared fixtures: a throwaway Dagster instance per test, and the database backends we support."""

from __future__ import annotations

import os
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PG_BASE_URL = os.environ.get("DURABLE_TEST_PG_URL", "postgresql://postgres@127.0.0.1:5432")


def _pg_available() -> bool:
    try:
        import psycopg2

        psycopg2.connect(f"{PG_BASE_URL}/postgres", connect_timeout=3).close()
        return True
    except Exception:
        return False


@pytest.fixture(autouse=True)
def _reap_job_processes() -> Iterator[None]:
    """Leave nothing behind: kill (by id) the `job` processes a test started, and their groups."""
    from tests.crash.helpers import JobProcess

    before = len(JobProcess.spawned)
    yield
    for p in JobProcess.spawned[before:]:
        p.reap_group()


@pytest.fixture
def dagster_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    home = tmp_path / "dagster_home"
    home.mkdir()
    (home / "dagster.yaml").write_text("telemetry:\n  enabled: false\n")
    monkeypatch.setenv("DAGSTER_HOME", str(home))
    return home


@pytest.fixture
def pg_database() -> Iterator[str]:
    """A fresh Postgres database for one test, dropped afterwards."""
    if not _pg_available():
        if os.environ.get("CI"):
            pytest.fail(f"Postgres is not reachable at {PG_BASE_URL}; .ci/run should have started it")
        pytest.skip("Postgres not reachable")
    import psycopg2

    name = f"durable_test_{uuid.uuid4().hex[:12]}"
    admin = psycopg2.connect(f"{PG_BASE_URL}/postgres")
    admin.autocommit = True
    admin.cursor().execute(f'CREATE DATABASE "{name}"')
    try:
        yield f"{PG_BASE_URL}/{name}"
    finally:
        from durable_assets.kit import db as kit_db

        for url, engine in list(kit_db._engines.items()):
            if url.endswith(name):
                engine.dispose()
                kit_db._engines.pop(url, None)
        admin.cursor().execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        admin.close()


@pytest.fixture(params=["sqlite", "postgres"])
def durable_db_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """Our tables on both supported backends."""
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'durable.db'}"
    return str(request.getfixturevalue("pg_database"))


def job_cli(
    *args: str, env: dict[str, str] | None = None, timeout: float = 120
) -> subprocess.CompletedProcess[str]:
    """Run the real ``job`` console script in its own process."""
    exe = REPO / ".venv" / "bin" / "job"
    cmd = [str(exe)] if exe.exists() else ["job"]
    return subprocess.run(
        [*cmd, *args], capture_output=True, text=True, env=env, timeout=timeout, check=False
    )
