"""The store's schema steps from before Alembic, replayed as revisions 0001-0003.

Those steps were counted in ``PRAGMA user_version`` (step N took a file from N-1 to N), and a file
of any earlier release says by that number which ones it has. Each such revision therefore runs
only on a file that lacks its step, so every older file is adopted in place, rows and all. The
steps' SQL is as it shipped and never changes (step 1 used ``IF NOT EXISTS``).
"""

from __future__ import annotations

from alembic import op


def apply_step(number: int, script: str) -> bool:
    """Run step ``number`` unless the file already has it; True when it ran."""
    bind = op.get_bind()
    if int(bind.exec_driver_sql("PRAGMA user_version").scalar() or 0) >= number:
        return False
    # One statement at a time: the sqlite3 driver executes one per call.
    for statement in script.split(";"):
        if statement.strip():
            bind.exec_driver_sql(statement)
    # Kept in step: a release from before Alembic reads it, and refuses a file newer than it knows.
    bind.exec_driver_sql(f"PRAGMA user_version = {number}")
    return True
