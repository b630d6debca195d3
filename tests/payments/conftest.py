"""Fixtures the payment tests share: an in-process simulator with a fixed fault seed."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from durable_assets.payments.simulator import SimulatorServer, build_server


@pytest.fixture
def sim(tmp_path: Path) -> Iterator[SimulatorServer]:
    """Serving on a free port until the test ends; ``sim.configure(...)`` switches faults on."""
    server = build_server("127.0.0.1", 0, str(tmp_path / "sim.db"), seed=7)
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True)
    thread.start()
    yield server
    server.shutdown()
    server.server_close()
    thread.join(timeout=5)
