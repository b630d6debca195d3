"""Scenario 7 — runs pruned per second by the retention job, against Dagster's own delete_run.

The measurement itself is ``bench/prune_bench.py`` (written with the retention job):
``measure(n_runs) -> {runs, seconds, runs_per_s, baseline_runs_per_s, ratio}``. It runs in its own
process (it builds and opens its own instances). Skipped, with a note, until that module and the
retention job it exercises are importable in this tree.
"""

from __future__ import annotations

import json
from pathlib import Path

from bench.harness import Result, Size, python_probe

SIZES = {"smoke": 100, "quick": 500, "full": 5_000}
NOT_IMPORTABLE = 3
_PROBE = """
import json, sys
try:
    from bench.prune_bench import measure
except ImportError as exc:
    print(f"{type(exc).__name__}: {exc}", file=sys.stderr)
    sys.exit(3)
print(json.dumps(measure(int(sys.argv[1]))))
"""


def run(size: Size, workdir: Path) -> Result:
    n = SIZES[size]
    title = f"pruning {n:,} runs"
    out = python_probe(_PROBE, n, workdir, timeout=3600)
    if out.returncode == NOT_IMPORTABLE:
        note = out.stderr.strip().splitlines()[-1] if out.stderr.strip() else "bench.prune_bench missing"
        return Result(7, title, measured="", skipped=f"retention job not in this tree ({note})")
    if out.returncode != 0:
        raise RuntimeError(f"prune_bench failed:\n{out.stderr[-2000:]}")
    m = json.loads(out.stdout.strip().splitlines()[-1])
    return Result(
        7,
        title,
        measured=f"{m['runs_per_s']:.0f} runs/s ({m['runs']:.0f} runs in {m['seconds']:.1f} s)",
        baseline=f"Dagster delete_run one by one: {m['baseline_runs_per_s']:.0f} runs/s",
        ratio=f"{m['ratio']:.1f}x",
        data={"prune": m},
    )
