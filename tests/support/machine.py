"""How slow this machine is now: the one factor by which the suite scales every wall-clock deadline.

A deadline in a test is a guess at how long real processes take, and the guess holds on the kind of
machine it was made on, quiet. On a shared CI runner or a laptop doing other work a `job` process
can take ten times as long to start, and a suite whose deadlines do not know it fails on time, not
on a wrong result. So the suite measures the machine two ways and keeps the slower: the wall time of
a fresh ``python -c "import dagster, pandas"`` (what every `job` process pays first, disk and CPU)
divided by :data:`REFERENCE_IMPORT_S`, and the share of a CPU this process gets (the wall time of a
short CPU-bound loop over the CPU time it used: 1 on an idle core, about 3 beside two busy loops per
core). The import alone read x1.0-1.2 while busy loops stretched every process 2-3x (a warm disk
cache and the scheduler's grouping favour a short probe); the share needs no reference machine.
The factor is clamped to [:data:`FLOOR`, :data:`CEILING`]. It is measured when the
session starts (tests/conftest.py) and again before a ``slow`` test when the last measure is older
than :data:`RECHECK_S` (before any other test, three times that), never during a test, so one test
sees one factor.

``wait_until``, ``Process.wait``, ``Process.terminate``, ``job_cli``, the crash tier's ``job`` and
pytest-timeout (tests/conftest.py) apply it; a test that bounds a wait itself calls :func:`scaled`.
The factor lives in this process's environment (:data:`FACTOR_ENV`), so pytest-xdist's workers
start with the controller's, and code outside a test session that shares these helpers (the
benchmark) keeps its deadlines as written: factor 1. ``DURABLE_TEST_SLOWNESS_FIXED=3`` imposes a
factor instead of measuring one.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time

#: Wall time of ``python -c "import dagster, pandas"`` (a fresh interpreter, warm disk cache) on a quiet
#: machine of the project's kind: 2 vCPUs (Intel Xeon, KVM), Python 3.11, the pinned Dagster and
#: pandas. Measured for issue 38 on 2026-12-05, 09:02 UTC, load average 0.5:
#: 10 runs of 1.01-1.16 s, median 1.05 s (user + sys 1.03-1.20 s). The same machine at a load of 4-5
#: (other work) took 1.1-3.4 s, which is what the factor is for.
REFERENCE_IMPORT_S = 1.05
#: Never shorter than written; at most this much longer: a machine slower than that is broken, and
#: a suite that waited 6x everywhere would already take most of CI's 90 minutes.
FLOOR, CEILING = 1.0, 6.0
#: A slow test measures the machine again when the last measure is older than this (a measure costs
#: about a second of CPU, so two workers re-measuring every minute cost the suite ~3% of one core).
RECHECK_S = 60.0
FACTOR_ENV = "DURABLE_TEST_SLOWNESS"
#: Set by a person (or a test of this module) to impose a factor instead of measuring one.
FIXED_ENV = "DURABLE_TEST_SLOWNESS_FIXED"
_MEASURED_AT_ENV = "DURABLE_TEST_SLOWNESS_AT"
_PROBE = "import dagster, pandas"
#: CPU seconds the share probe spins for: long enough to span many scheduler slices (4 ms each).
SPIN_CPU_S = 0.3


def clamp(factor: float) -> float:
    return min(max(factor, FLOOR), CEILING)


def measure() -> float:
    """Time the probe now; record the factor for this process (and the processes it starts)."""
    started = time.monotonic()
    try:
        if os.environ.get(FIXED_ENV):
            factor = clamp(float(os.environ[FIXED_ENV]))
        else:
            subprocess.run([sys.executable, "-c", _PROBE], check=True, capture_output=True, timeout=120)
            imported = (time.monotonic() - started) / REFERENCE_IMPORT_S
            factor = clamp(max(imported, cpu_share_slowness()))
    except subprocess.TimeoutExpired:
        factor = CEILING  # 120 s for an import: as slow as we allow for
    os.environ[FACTOR_ENV] = f"{factor:.2f}"
    os.environ[_MEASURED_AT_ENV] = repr(time.monotonic())
    return factor


def cpu_share_slowness(cpu_s: float = SPIN_CPU_S) -> float:
    """Wall time over CPU time of a CPU-bound loop in this process: how many times longer than on an
    idle core any CPU-bound work takes here now."""
    wall, cpu = time.monotonic(), time.process_time()
    x = 0
    while time.process_time() - cpu < cpu_s:
        for i in range(10_000):
            x ^= i
    return (time.monotonic() - wall) / max(time.process_time() - cpu, 1e-6)


def refresh(max_age_s: float = RECHECK_S) -> float:
    """The factor, measured again if the last measure (this process's, or the one it inherited from
    the process that started it: the clock is the system's monotonic one) is older than ``max_age_s``."""
    at = os.environ.get(_MEASURED_AT_ENV)
    try:
        fresh = at is not None and 0 <= time.monotonic() - float(at) < max_age_s
    except ValueError:
        fresh = False
    return slowness() if fresh and FACTOR_ENV in os.environ else measure()


def slowness() -> float:
    """The factor in force: 1 outside a measured test session."""
    try:
        return clamp(float(os.environ.get(FACTOR_ENV, FLOOR)))
    except ValueError:
        return FLOOR


def scaled(seconds: float) -> float:
    """``seconds`` written for a quiet machine, as a deadline on this machine now."""
    return seconds * slowness()


def unscaled(seconds: float) -> float:
    """The inverse of :func:`scaled`: what is left of a deadline already scaled, in the quiet-machine
    seconds the helpers take (so a helper's own scaling does not apply twice)."""
    return seconds / slowness()
