"""Fixtures the payment tests share: an in-process simulator with a fixed fault seed."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from durable_assets_testing.simulator import SimulatorServer
from tests.support.simulator import ThreadedSimulator


@pytest.fixture
def sim(tmp_path: Path) -> Iterator[SimulatorServer]:
    """Serving on a free port until the test ends; ``sim.configure(...)`` switches faults on."""
    with ThreadedSimulator(tmp_path / "sim.db", seed=7) as served:
        yield served.server
