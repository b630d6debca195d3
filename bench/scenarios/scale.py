"""Scenario 6 — load -> validate -> candidates on 10k, 100k (and at full size 1M) invoices.

Each size runs in its own process (bench/scale_worker.py), so its peak RSS (``ru_maxrss``) is its
own. Goal at 1M: under 60 s and under 2 GB. Growth is reported as the ratio from one size to the
next (10x the invoices; linear would be 10x the time).
"""

from __future__ import annotations

import itertools
import json
from pathlib import Path
from typing import Any

from bench.harness import Result, Size, python_probe

SIZES = {"smoke": [10_000], "quick": [10_000, 100_000], "full": [10_000, 100_000, 1_000_000]}
GOAL_S, GOAL_MB = 60.0, 2048.0


def measure(n: int, workdir: Path) -> dict[str, Any]:
    out = python_probe("from bench.scale_worker import main; main()", n, workdir, timeout=900)
    if out.returncode != 0:
        raise RuntimeError(f"scale worker for {n} failed:\n{out.stderr[-2000:]}")
    return dict(json.loads(out.stdout.strip().splitlines()[-1]))


def run(size: Size, workdir: Path) -> Result:
    rows = [measure(n, workdir) for n in SIZES[size]]
    growth = [
        {
            "from": a["invoices"],
            "to": b["invoices"],
            "time_x": round(b["total_s"] / a["total_s"], 2),
            "rss_x": round(b["peak_rss_mb"] / a["peak_rss_mb"], 2),
        }
        for a, b in itertools.pairwise(rows)
    ]
    top = rows[-1]
    per = "; ".join(f"{r['invoices']:,}: {r['total_s']:.1f} s, {r['peak_rss_mb']:.0f} MB" for r in rows)
    grow = ", ".join(f"x{g['time_x']} time, x{g['rss_x']} RSS per 10x" for g in growth)
    met = top["total_s"] < GOAL_S and top["peak_rss_mb"] < GOAL_MB if top["invoices"] >= 1_000_000 else None
    return Result(
        6,
        f"load -> validate -> candidates, up to {top['invoices']:,} invoices",
        measured=per,
        baseline=f"interpreter + imports {top['rss_after_imports_mb']:.0f} MB",
        ratio=grow or "-",
        goal="1M: < 60 s, < 2 GB" + ("" if met is not None else " (full size only)"),
        met=met,
        data={"sizes": rows, "growth": growth, "goal_s": GOAL_S, "goal_mb": GOAL_MB},
    )
