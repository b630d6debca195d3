"""Debian's Chromium for the UI and CORS tests, driven by pip's playwright (never a downloaded browser).

`scripts/setup.sh --with-browser` installs it; on a fresh machine the test command may start while
apt is still unpacking it, so :func:`chromium_binary` waits for that instead of failing at once.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.machine import scaled
from tests.support.polling import wait_until

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-dev-shm-usage",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]
CHROMIUM_INSTALL_DEADLINE_S = 600.0


def _apt_running() -> bool:
    for pid in filter(str.isdigit, os.listdir("/proc")):
        with contextlib.suppress(OSError):
            if Path(f"/proc/{pid}/comm").read_text().strip() in ("apt", "apt-get", "dpkg"):
                return True
    return False


def chromium_binary() -> Path:
    """The browser's path, once apt (if it is running) has finished installing it."""
    wait_until(
        lambda: os.access(CHROMIUM, os.X_OK) or not _apt_running(),
        CHROMIUM_INSTALL_DEADLINE_S,
        interval=2,
        what=f"apt to finish installing {CHROMIUM}",
    )
    if not os.access(CHROMIUM, os.X_OK):
        pytest.fail(f"{CHROMIUM} is missing; scripts/setup.sh --with-browser installs Debian's chromium")
    return Path(CHROMIUM)


@contextlib.contextmanager
def headless_chromium() -> Iterator[Any]:
    """A playwright ``Browser`` on Debian's Chromium, closed on exit."""
    from playwright.sync_api import sync_playwright

    binary = chromium_binary()
    with sync_playwright() as p:
        browser = p.chromium.launch(
            executable_path=str(binary), args=CHROMIUM_ARGS, headless=True, timeout=scaled(30) * 1000
        )
        try:
            yield browser
        finally:
            browser.close()
