"""The suite's deadlines follow the machine (tests/support/machine.py): measured, clamped, applied by
the helpers and to pytest-timeout, and printed; ``full`` tests wait for ``--full``."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tests.support import machine
from tests.support.polling import WaitTimeout, wait_until
from tests.support.processes import REPO, Process, ProcessTimeout


def test_the_factor_in_force_is_measured_and_clamped(monkeypatch: pytest.MonkeyPatch) -> None:
    assert machine.FLOOR <= machine.slowness() <= machine.CEILING
    monkeypatch.setenv(machine.FACTOR_ENV, "100")
    assert machine.slowness() == machine.CEILING
    monkeypatch.setenv(machine.FACTOR_ENV, "0.2")  # a machine faster than the reference: as written
    assert machine.slowness() == machine.FLOOR
    monkeypatch.setenv(machine.FACTOR_ENV, "2.5")
    assert machine.scaled(10) == 25 and machine.unscaled(25) == 10


def test_a_cpu_bound_probe_reads_the_share_of_a_cpu_this_process_gets() -> None:
    """Wall over CPU time: never below 1 (one thread cannot use more CPU than time passes), and
    below the ceiling on a machine the suite can run on at all."""
    share = machine.cpu_share_slowness(0.05)
    assert 0.95 <= share < machine.CEILING * 4


def test_a_fresh_measure_is_reused_and_a_stale_one_measured_again(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in (machine.FACTOR_ENV, machine._MEASURED_AT_ENV):  # measure() writes them: restored after
        monkeypatch.setenv(name, os.environ.get(name, ""))
    monkeypatch.setenv(machine.FIXED_ENV, "2")
    assert machine.measure() == 2.0 and machine.refresh() == 2.0
    monkeypatch.setenv(machine.FIXED_ENV, "3")
    assert machine.refresh() == 2.0  # measured a moment ago
    assert machine.refresh(max_age_s=0) == 3.0


def test_wait_until_and_process_wait_allow_the_scaled_deadline(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(machine.FACTOR_ENV, "3")
    with pytest.raises(WaitTimeout, match=r"limit 0\.3 s: 0\.1 s on a quiet machine x3\.00"):
        wait_until(lambda: False, timeout=0.1, interval=0.01, what="nothing")
    sleeper = Process([sys.executable, "-c", "import time; time.sleep(60)"], os.environ, tmp_path / "out")
    with pytest.raises(ProcessTimeout, match=r"did not finish in 0 s \(0\.1 s on a quiet machine x3\.00\)"):
        sleeper.wait(0.1)


def test_pytest_timeout_is_scaled_the_tier_is_chosen_and_the_factor_printed(tmp_path: Path) -> None:
    """A test of 1.5 s under a 1 s timeout passes at factor 2 and fails at factor 1; a ``full`` test
    runs only with ``--full``. A pytest of its own, with this suite's conftest as a plugin."""
    (tmp_path / "test_probe.py").write_text(
        textwrap.dedent(
            """
            import time
            import pytest

            @pytest.mark.timeout(1)
            def test_takes_1_5_s():
                time.sleep(1.5)

            @pytest.mark.full
            def test_a_repeat():
                pass
            """
        )
    )

    def pytest_run(factor: str, *args: str) -> subprocess.CompletedProcess[str]:
        env = {**os.environ, "PYTHONPATH": str(REPO), machine.FIXED_ENV: factor}
        for name in (machine.FACTOR_ENV, "DURABLE_CRASH_ENUMERATE"):
            env.pop(name, None)
        argv = [sys.executable, "-m", "pytest", "-p", "tests.conftest", "-p", "no:cacheprovider", *args]
        return subprocess.run(
            [*argv, "-o", "markers=full", "--rootdir", str(tmp_path), str(tmp_path)],
            cwd=tmp_path,
            env=env,
            capture_output=True,
            text=True,
            timeout=machine.scaled(120),
            check=False,
        )

    slow = pytest_run("2", "-q")
    assert slow.returncode == 0, slow.stdout + slow.stderr
    assert slow.stdout.startswith("deadlines x2.00 (imposed by"), slow.stdout
    assert "1 passed, 1 deselected" in slow.stdout, slow.stdout
    assert "deadlines: x2.00 at the start, x2.00 to x2.00 over 1 tests" in slow.stdout, slow.stdout

    quiet = pytest_run("1", "--full")
    assert quiet.returncode == 1, quiet.stdout + quiet.stderr
    assert "deadlines x1.00 (imposed by" in quiet.stdout  # the header, without -q
    assert "Timeout (>1.0s)" in quiet.stdout and "1 failed, 1 passed" in quiet.stdout, quiet.stdout
    assert "this test's deadlines were x1.00" in quiet.stdout, quiet.stdout
