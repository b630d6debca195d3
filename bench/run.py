"""Kept so `python bench/run.py` still works; the suite is the ``bench`` package (`python -m bench`)."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.cli import main

if __name__ == "__main__":
    raise SystemExit(main())
