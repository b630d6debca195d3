"""Which imports a piece of code executes while it runs, seen from a fresh interpreter.

``sys.modules`` cannot tell: Dagster's storage loads Alembic on import, so any process that loads
the kit has it. What a fast path must avoid is *executing* the import (and the work behind it), and
every ``import`` statement goes through ``builtins.__import__``, already loaded or not.
"""

from __future__ import annotations

import json
import subprocess
import sys

_PROBE = """
import builtins, json, sys
exec(sys.argv[1])
seen = []
real = builtins.__import__
def watch(name, globals=None, locals=None, fromlist=(), level=0):
    seen.append(name)
    return real(name, globals, locals, fromlist, level)
builtins.__import__ = watch
try:
    exec(sys.argv[2])
finally:
    builtins.__import__ = real
print(json.dumps(seen))
"""


def imports_during(setup: str, action: str) -> list[str]:
    """The module names ``action`` imports (absolute or as written), after ``setup`` ran untraced."""
    done = subprocess.run(
        [sys.executable, "-c", _PROBE, setup, action],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return [str(name) for name in json.loads(done.stdout.strip().splitlines()[-1])]
