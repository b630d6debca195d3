"""scripts/ui.sh's output, when it goes to a file: plain text, and no Dagster warning a user cannot act
on (#23 item 7)."""

from __future__ import annotations

import signal
from pathlib import Path

import pytest

from tests.support.dagster_dev import UiProcess
from tests.support.homes import shipped_home

pytestmark = pytest.mark.slow


def test_ui_log_has_no_ansi_codes_and_no_supersession_warning(tmp_path: Path) -> None:
    ui = UiProcess(shipped_home(tmp_path), tmp_path / "ui.log")
    try:
        ui.wait_loaded()
    finally:
        if ui.proc.poll() is None:
            ui.stop(signal.SIGTERM)
    text = (tmp_path / "ui.log").read_text(errors="replace")
    assert "Launching Dagster services" in text, text[-2000:]  # Dagster's own log lines are there
    assert "\x1b[" not in text, [line for line in text.splitlines() if "\x1b[" in line][:3]
    assert "SupersessionWarning" not in text and "superseded" not in text
