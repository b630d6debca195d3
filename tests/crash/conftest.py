"""The crash tier runs on both instance backends: SQLite files, and one real Postgres database per
test (Dagster's storage and our tables together, as `dagster_home/postgres` configures it)."""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from durable_assets.ops import registry
from tests.support.homes import make_home
from tests.support.tutorial import tutorial_folder

from .helpers import Simulator


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def home(request: pytest.FixtureRequest, tmp_path: Path) -> Path:
    pg_url = str(request.getfixturevalue("pg_database")) if request.param == "postgres" else None
    return make_home(tmp_path, pg_url)


@pytest.fixture
def simulator(tmp_path: Path) -> Iterator[Callable[..., Simulator]]:
    """Start simulators with fault options; every one is stopped after the test."""
    started: list[Simulator] = []

    def start(**faults: Any) -> Simulator:
        sim = Simulator(tmp_path / f"simulator-{len(started)}.db", **faults)
        started.append(sim)
        return sim

    yield start
    for sim in started:
        sim.close()


@pytest.fixture
def served_from(monkeypatch: pytest.MonkeyPatch) -> Iterator[Callable[[Path], None]]:
    """Make this process read batches through the folder's location, as `job` run in it does
    (the test's status reads must know the `postcards` job); undone after the test."""

    def serve(folder: Path) -> None:
        monkeypatch.setenv("DURABLE_CODE_LOCATION", "postcards")
        monkeypatch.syspath_prepend(str(folder))
        monkeypatch.setattr(registry, "_built", None)  # importing it builds it: forgotten after the test
        monkeypatch.setitem(sys.modules, "postcards", importlib.import_module("postcards"))

    yield serve
    registry._load.cache_clear()  # the next test's folder is another one


#: (the tutorial's folder, its print shop's database file, the logs folder)
ServedTutorial = tuple[Path, Path, Path]


@pytest.fixture
def served_tutorial(tmp_path: Path, served_from: Callable[[Path], None]) -> ServedTutorial:
    """The tutorial's folder served as this process's location (:func:`served_from`), beside the
    file its print shop writes and a logs folder: what every test of a user's served job starts from."""
    folder = tutorial_folder(tmp_path)
    served_from(folder)
    logs = tmp_path / "logs"
    logs.mkdir()
    return folder, tmp_path / "shop.db", logs


def pytest_terminal_summary(terminalreporter: Any) -> None:
    """How many crash states test_crash_points.py explored in this session (when it ran)."""
    module = sys.modules.get("tests.crash.test_crash_points")
    explored = getattr(module, "EXPLORED", None)
    if explored is not None and explored.states:
        terminalreporter.write_line(explored.summary())
