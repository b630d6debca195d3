"""The crash tier runs on both instance backends: SQLite files, and one real Postgres database per
test (Dagster's storage and our tables together, as `dagster_home/postgres` configures it)."""

from __future__ import annotations

from pathlib import Path

import pytest

from .helpers import make_home


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def home(request: pytest.FixtureRequest, tmp_path: Path) -> Path:
    pg_url = str(request.getfixturevalue("pg_database")) if request.param == "postgres" else None
    return make_home(tmp_path, pg_url)
