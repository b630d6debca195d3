"""Shared fixtures: a throwaway Dagster instance per test, and the database backends we support."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support import machine
from tests.support.homes import PG_BASE_URL, make_home, postgres_available, postgres_database
from tests.support.processes import REPO, Process

__all__ = ["REPO", "job_cli"]


def pytest_configure(config: pytest.Config) -> None:
    """Measure the machine once for the session (xdist's workers inherit the factor)."""
    if not hasattr(config, "workerinput"):  # the controller (or a run without xdist)
        machine.measure()


def _factor_line() -> str:
    return (
        f"deadlines x{machine.slowness():.2f} (this machine: `import dagster, pandas` against "
        f"{machine.REFERENCE_IMPORT_S} s quiet; floor {machine.FLOOR}, ceiling {machine.CEILING}; "
        f"tests/support/machine.py)"
    )


def pytest_report_header(config: pytest.Config) -> str:
    return _factor_line()


def pytest_sessionstart(session: pytest.Session) -> None:
    """The factor also under ``-q`` (which prints no header): a timeout in CI's log is then read
    against how slow the machine was."""
    config = session.config
    reporter = config.pluginmanager.get_plugin("terminalreporter")
    if reporter is not None and not hasattr(config, "workerinput") and config.option.verbose < 0:
        reporter.write_line(_factor_line())


_BASE_TIMEOUT = pytest.StashKey[float]()


@pytest.hookimpl(hookwrapper=True, tryfirst=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
    """Scale the test's pytest-timeout (its marker, else the ini's) by the machine's factor, measured
    again before a slow test; runs before pytest-timeout's own wrapper reads the marker."""
    factor = machine.refresh() if item.get_closest_marker("slow") else machine.slowness()
    if _BASE_TIMEOUT not in item.stash:
        marker = item.get_closest_marker("timeout")
        base = None
        if marker is not None:
            base = marker.args[0] if marker.args else marker.kwargs.get("timeout")
        item.stash[_BASE_TIMEOUT] = float(base if base is not None else item.config.getini("timeout") or 0)
    base_timeout = item.stash[_BASE_TIMEOUT]
    if base_timeout > 0:
        item.add_marker(pytest.mark.timeout(base_timeout * factor), append=False)  # the closest
    yield


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
        [*cmd, *args], capture_output=True, text=True, env=env, timeout=machine.scaled(timeout), check=False
    )
