"""Shared fixtures: a throwaway Dagster instance per test, and the database backends we support."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.homes import PG_BASE_URL, make_home, postgres_available, postgres_database
from tests.support.processes import REPO, Process

__all__ = ["REPO", "job_cli"]


@pytest.fixture(autouse=True)
def _reap_job_processes() -> Iterator[None]:
    """Leave nothing behind: kill (by id) the processes a test started, and their groups."""
    before = len(Process.spawned)
    yield
    for p in Process.spawned[before:]:
        p.reap_group()


@pytest.fixture
def dagster_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    home = make_home(tmp_path)
    monkeypatch.setenv("DAGSTER_HOME", str(home))
    return home


@pytest.fixture
def pg_database() -> Iterator[str]:
    """A fresh Postgres database for one test, dropped afterwards."""
    if not postgres_available():
        if os.environ.get("CI"):
            pytest.fail(f"Postgres is not reachable at {PG_BASE_URL}; .ci/run should have started it")
        pytest.skip("Postgres not reachable")
    with postgres_database() as url:
        yield url


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
