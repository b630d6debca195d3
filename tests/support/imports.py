"""Which libraries a piece of code loads, run in a fresh interpreter (so nothing this test process
imported counts)."""

from __future__ import annotations

import json
import subprocess
import sys

from .machine import scaled

_PROBE = """
import json, sys
exec(sys.argv[1])
print(json.dumps(sorted({name.split(".")[0] for name in sys.modules})))
"""


def libraries_loaded_by(code: str) -> set[str]:
    """The top-level packages in ``sys.modules`` once ``code`` has run."""
    done = subprocess.run(
        [sys.executable, "-c", _PROBE, code], capture_output=True, text=True, timeout=scaled(120)
    )
    assert done.returncode == 0, done.stderr
    return set(json.loads(done.stdout.strip().splitlines()[-1]))
