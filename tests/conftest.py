"""Shared fixtures: a throwaway Dagster instance per test, and the database backends we support."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
import pytest_timeout

from durable_assets.payments.resources import forget_checked_account
from tests.support import machine
from tests.support.homes import PG_BASE_URL, make_home, postgres_available, postgres_database
from tests.support.processes import REPO, Process

__all__ = ["REPO", "job_cli"]

#: Set by ``--full`` (scripts/test.sh --full) for the whole session and its workers; the crash tier's
#: modules read it when they are collected (the full crash-point enumeration, every random kill point).
FULL_ENV = "DURABLE_CRASH_ENUMERATE"


# --- tiers: the default proves each thing once, --full repeats the proofs -------------------------


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--full",
        action="store_true",
        help="also the tests marked `full` and the full crash enumeration (DURABLE_CRASH_ENUMERATE=full)",
    )


def _full(config: pytest.Config) -> bool:
    return bool(config.getoption("--full")) or os.environ.get(FULL_ENV, "").strip().lower() == "full"


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Tests marked ``full`` repeat a proof the default tier makes once: deselected unless ``--full``
    (or a ``-m`` expression that names them)."""
    if _full(config) or "full" in (config.getoption("markexpr") or ""):
        return
    repeats = [item for item in items if item.get_closest_marker("full")]
    if repeats:
        config.hook.pytest_deselected(items=repeats)
        items[:] = [item for item in items if not item.get_closest_marker("full")]


# --- deadlines that follow the machine (tests/support/machine.py) ---------------------------------


def pytest_configure(config: pytest.Config) -> None:
    if config.getoption("--full"):
        os.environ[FULL_ENV] = "full"  # before any test module is imported, in every xdist worker too
    if not hasattr(config, "workerinput"):  # the controller (or a run without xdist): its workers inherit
        _at_start.append(machine.measure())


_at_start: list[float] = []
#: The factor each test ran with, read from its setup report (sent by xdist's workers too).
_factors_seen: list[float] = []


def _factor_line(prefix: str = "deadlines") -> str:
    how = (
        f"imposed by {machine.FIXED_ENV}"
        if os.environ.get(machine.FIXED_ENV)
        else f"`import dagster, pandas` against {machine.REFERENCE_IMPORT_S:g} s on a quiet machine"
    )
    return (
        f"{prefix} x{machine.slowness():.2f} ({how}; floor {machine.FLOOR:g}, ceiling {machine.CEILING:g}, "
        f"measured again as the run goes; tests/support/machine.py)"
    )


def pytest_report_header(config: pytest.Config) -> str:
    return _factor_line()


@pytest.hookimpl(trylast=True)
def pytest_sessionstart(session: pytest.Session) -> None:
    """Under ``-q`` (scripts/test.sh) pytest prints no header: the factor is then the first line, so
    that a timeout in a CI log is read against how slow the machine was."""
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    if reporter is not None and not hasattr(session.config, "workerinput") and not reporter.showheader:
        reporter.write_line(_factor_line())


@pytest.hookimpl(hookwrapper=True, tryfirst=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
    """Before a test (before its fixtures and its timeout start), measure the machine again if the
    last measure is older than machine.RECHECK_S (a slow test) or three times that (any other: a
    quick run that lasts minutes follows the load too); the report carries the factor it ran with."""
    slow = item.get_closest_marker("slow") is not None
    factor = machine.refresh(machine.RECHECK_S if slow else 3 * machine.RECHECK_S)
    item.user_properties.append(("slowness", factor))
    yield


@pytest.hookimpl(tryfirst=True)
def pytest_timeout_set_timer(item: pytest.Item, settings: pytest_timeout.Settings) -> bool:
    """pytest-timeout's own timer (signal or thread), for the test's timeout (its marker's, or the
    ini's or ``--timeout``'s) times the machine's slowness; the failure then names the scaled value."""
    scaled = settings._replace(timeout=machine.scaled(settings.timeout))
    return bool(pytest_timeout.pytest_timeout_set_timer(item=item, settings=scaled))


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    outcome = yield
    report = outcome.get_result()
    if report.failed:
        report.sections.append(("deadlines", _factor_line("this test's deadlines were")))


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    if report.when == "setup":
        factor = dict(report.user_properties).get("slowness")
        if isinstance(factor, (int, float)):
            _factors_seen.append(float(factor))


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    """The factors the tests ran with: how loaded the machine was during the run, in one line."""
    if _factors_seen and _at_start:
        low, high = min(_factors_seen), max(_factors_seen)
        terminalreporter.write_line(
            f"deadlines: x{_at_start[0]:.2f} at the start, x{low:.2f} to x{high:.2f} over "
            f"{len(_factors_seen)} tests (tests/support/machine.py)"
        )


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
    *args: str, env: dict[str, str] | None = None, timeout: float = 120, cwd: Path | None = None
) -> subprocess.CompletedProcess[str]:
    """Run the real ``job`` console script in its own process (``timeout``: quiet-machine seconds,
    scaled by the machine's slowness; ``cwd``: where it runs, e.g. a folder outside the repository)."""
    exe = REPO / ".venv" / "bin" / "job"
    cmd = [str(exe)] if exe.exists() else ["job"]
    return subprocess.run(
        [*cmd, *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=machine.scaled(timeout),
        check=False,
        cwd=cwd,
    )


@pytest.fixture(autouse=True)
def _no_account_check_from_an_earlier_test() -> None:
    """A run reuses its thread's recent check of the provider's account (payments/resources.py);
    one test's check must not answer for the next test's provider, started anew at the same address."""
    forget_checked_account()
