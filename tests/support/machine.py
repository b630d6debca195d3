"""How slow this machine is now: the one factor every wall-clock deadline of the suite is scaled by.

A deadline in a test is a guess at how long a real process takes, and the guess is right only on
the machine it was made on. On a shared CI runner or a laptop doing other work, a `job` process
takes ten times as long to start, and a suite whose deadlines do not know it fails on time, not on
a wrong result. So the suite measures the machine: the wall time of a fresh
``python -c "import dagster, pandas"`` (what every `job` process pays first) against
:data:`REFERENCE_IMPORT_S`, at session start and again before each slow test (at most every
:data:`RECHECK_S`), clamped to [:data:`FLOOR`, :data:`CEILING`]. ``wait_until``, ``Process.wait``,
``Process.terminate``, ``job_cli`` and pytest-timeout (tests/conftest.py) apply it; a test that
waits otherwise calls :func:`scaled`.

The factor lives in the environment (:data:`FACTOR_ENV`), set by the pytest process that measured
it, so xdist's workers start with the session's and code outside the suite (the benchmark) that
shares these helpers keeps its own deadlines as written (factor 1).
"""

from __future__ import annotations

import os
import subprocess
import sys
import time

#: ``python -c "import dagster, pandas"`` on a quiet 2-core machine of the project's kind
#: (python-svc, 2026-12-05: 0.86-0.98 s over several runs, load < 1). The deadlines in the tests were
#: set on such a machine.
REFERENCE_IMPORT_S = 0.9
#: Never shorter than written; at most this much longer (a machine slower than that is broken, and
#: a suite that waited 6x everywhere would already take most of CI's 90 minutes).
FLOOR, CEILING = 1.0, 6.0
#: A slow test re-measures the machine when the last measure is older than this.
RECHECK_S = 60.0
FACTOR_ENV = "DURABLE_TEST_SLOWNESS"
_MEASURED_AT_ENV = "DURABLE_TEST_SLOWNESS_AT"


def measure() -> float:
    """Measure the machine now, record the factor for this process and its children, return it."""
    started = time.monotonic()
    subprocess.run(
        [sys.executable, "-c", "import dagster, pandas"], check=True, capture_output=True, timeout=300
    )
    took = time.monotonic() - started
    factor = min(max(took / REFERENCE_IMPORT_S, FLOOR), CEILING)
    os.environ[FACTOR_ENV] = f"{factor:.2f}"
    os.environ[_MEASURED_AT_ENV] = f"{time.time():.0f}"
    return factor


def refresh() -> float:
    """The factor, measured again if the last measure is older than :data:`RECHECK_S`."""
    at = float(os.environ.get(_MEASURED_AT_ENV, "0") or 0)
    if FACTOR_ENV not in os.environ or time.time() - at > RECHECK_S:
        return measure()
    return slowness()


def slowness() -> float:
    """The factor in force (1 outside a measured test session)."""
    try:
        return min(max(float(os.environ.get(FACTOR_ENV, FLOOR)), FLOOR), CEILING)
    except ValueError:
        return FLOOR


def scaled(seconds: float) -> float:
    """``seconds`` as a deadline on this machine now."""
    return seconds * slowness()
