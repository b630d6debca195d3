"""The suite's deadlines follow the machine (tests/support/machine.py): measured, clamped, applied."""

from __future__ import annotations

import pytest

from tests.support import machine
from tests.support.polling import WaitTimeout, wait_until


def test_the_factor_is_measured_and_clamped() -> None:
    factor = machine.slowness()
    assert machine.FLOOR <= factor <= machine.CEILING
    assert machine.scaled(10) == pytest.approx(10 * factor)


@pytest.mark.timeout(7)
def test_a_tests_own_timeout_is_scaled(request: pytest.FixtureRequest) -> None:
    marker = request.node.get_closest_marker("timeout")
    assert marker.args[0] == pytest.approx(7 * machine.slowness())


def test_wait_until_waits_the_scaled_deadline(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(machine.FACTOR_ENV, "3")
    with pytest.raises(WaitTimeout, match=r"limit 0\.3 s"):
        wait_until(lambda: False, timeout=0.1, interval=0.01, what="nothing")
    monkeypatch.setenv(machine.FACTOR_ENV, "100")  # past the ceiling: clamped
    assert machine.slowness() == machine.CEILING
