"""docs/your-own-job.md as code: its ``# file:`` blocks, a reader's folder made of them, and the
print shop's SQLite file read from outside every process that writes it.

Shared by the tests that run the tutorial's jobs through the CLI (tests/test_tutorial.py), import
its location (tests/test_location.py), or launch it from the Dagster UI and let the daemon resume it
(tests/crash/test_user_job_auto_resume.py): each one runs the page as printed, not a copy of it.
"""

from __future__ import annotations

import re
import sqlite3
from pathlib import Path

from .processes import REPO

DOC = REPO / "docs" / "your-own-job.md"
#: The page's modules: the two-step job and the five-step one (which imports the first).
MODULES = ("postcards", "greetings")


def tutorial_module(name: str = "postcards") -> str:
    """Every ``# file: NAME.py`` block of the page, joined in order: the module as a reader saves it."""
    return "\n\n".join(re.findall(rf"```python\n# file: {name}\.py\n(.*?)```", DOC.read_text(), re.S))


def tutorial_folder(root: Path) -> Path:
    """``root/code``, an otherwise empty folder holding only the page's modules, as a reader makes it
    (outside the repository, so nothing of ours is importable from it by accident)."""
    code = root / "code"
    code.mkdir()
    for name in MODULES:
        (code / f"{name}.py").write_text(tutorial_module(name))
    return code


def shop_count(db: Path, sql: str) -> int:
    """One number from the print shop's file (0 before the shop made it or its tables): the shop
    is the side effect's own record, which outlives every worker that wrote to it."""
    if not db.exists():
        return 0
    with sqlite3.connect(db, timeout=30) as conn:
        try:
            return int(conn.execute(sql).fetchone()[0])
        except sqlite3.OperationalError:  # the shop has not created its tables yet
            return 0
