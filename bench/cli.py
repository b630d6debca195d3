"""`python -m bench`: run the scenarios, print one table, write the JSON.

    scripts/bench.sh                 # every scenario at the quick size (< 10 min on a 2-core machine)
    scripts/bench.sh --full          # the issue's sizes (20,000 refunds, 1M invoices, 5,000 runs...)
    scripts/bench.sh --only 1,3      # some scenarios
    BENCH_SIZE=smoke scripts/bench.sh --only 1,2,3   # CI's harness check: tiny sizes, no goals judged

Every figure is measured in this invocation, next to a baseline measured in the same invocation,
because these machines are shared and noisy and an absolute number alone means little.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Sequence
from datetime import UTC, datetime
from importlib import metadata
from pathlib import Path
from typing import Any, cast

from bench.harness import Result, Size
from bench.scenarios import registry
from tests.support.processes import REPO

DEFAULT_JSON = REPO / "bench" / "results" / "latest.json"


def _parse(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="bench", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--full", action="store_true", help="the issue's full sizes instead of the quick ones")
    p.add_argument("--only", default="", help="comma-separated scenario numbers, e.g. 1,3 (default: all)")
    p.add_argument("--json", type=Path, default=DEFAULT_JSON, help=f"where to write results ({DEFAULT_JSON})")
    p.add_argument("--keep", action="store_true", help="keep the work directory (logs, instances) afterwards")
    p.add_argument(
        "--size",
        choices=["smoke", "quick", "full"],
        default=os.environ.get("BENCH_SIZE") or None,
        help="explicit size (smoke = CI's harness check); --full is --size full",
    )
    return p.parse_args(argv)


def _version(dist: str) -> str | None:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


def _git(*args: str) -> str | None:
    try:
        out = subprocess.run(["git", "-C", str(REPO), *args], capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout.strip() if out.returncode == 0 else None


def machine_info() -> dict[str, Any]:
    return {
        "platform": platform.platform(),
        "cpu_count": os.cpu_count(),
        "python": platform.python_version(),
        "dagster": _version("dagster"),
        "stripe": _version("stripe"),
        "pandas": _version("pandas"),
        "git_commit": _git("rev-parse", "HEAD"),
        "git_dirty": bool(_git("status", "--porcelain", "--untracked-files=no")),
    }


def _load() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


def run_scenario(number: int, size: Size, workdir: Path) -> Result:
    module_name, name = registry()[number]
    t0 = time.monotonic()
    try:
        module = importlib.import_module(f"bench.scenarios.{module_name}")
        result = cast(Result, module.run(size, workdir))
    except Exception as exc:  # one broken scenario must not lose the others' numbers
        traceback.print_exc()
        result = Result(number, name, measured=f"ERROR: {type(exc).__name__}: {exc}"[:300], met=False)
        result.data["error"] = traceback.format_exc()
    result.data["scenario_seconds"] = round(time.monotonic() - t0, 1)
    return result


def table(results: Sequence[Result], judge: bool = True) -> str:
    """Markdown, so the README's Performance section is a paste of a real run. Goals are judged
    (✓/✗) only at real sizes: a smoke run checks the harness, not the numbers."""
    lines = ["| # | scenario | measured | baseline (same run) | ratio | goal |", "|---|---|---|---|---|---|"]
    for r in results:
        if r.skipped:
            lines.append(f"| {r.number} | {r.title} | skipped: {r.skipped} | | | |")
            continue
        mark = {True: " ✓", False: " ✗", None: ""}[r.met] if r.goal and judge else ""
        lines.append(f"| {r.number} | {r.title} | {r.measured} | {r.baseline} | {r.ratio} | {r.goal}{mark} |")
    return "\n".join(lines)


def _compile_tree() -> None:
    """Our modules' bytecode, written once before anything is timed, as ``pip install`` writes it.

    The floor imports Dagster and pandas from the bytecode their install wrote; a `job` process
    started with ``PYTHONDONTWRITEBYTECODE`` set (as some shells and CI images set it) would
    compile every module of ours from source on every start instead (~90 of them), a cost no
    installed copy pays. ``compileall`` writes it whatever that variable says, and a process
    still reads bytecode when the variable is set.
    """
    import compileall

    for package in ("durable_assets", "durable_assets_testing"):
        compileall.compile_dir(REPO / package, quiet=1)


def main(argv: Sequence[str] | None = None) -> int:
    args = _parse(argv)
    size: Size = cast(Size, args.size or ("full" if args.full else "quick"))
    known = registry()
    numbers = sorted({int(x) for x in args.only.split(",") if x.strip()}) if args.only else sorted(known)
    unknown = [n for n in numbers if n not in known]
    if unknown:
        print(f"bench: no scenario {unknown}; known: {sorted(known)}", file=sys.stderr)
        return 2
    info = machine_info() | {
        "size": size,
        "started_at": datetime.now(UTC).isoformat(),
        "load_avg_start": _load(),
    }
    _compile_tree()
    t0 = time.monotonic()
    results: list[Result] = []
    tmp = tempfile.mkdtemp(prefix="durable-bench-")
    try:
        for n in numbers:
            print(f"bench: scenario {n} ({known[n][1]}, {size})...", file=sys.stderr, flush=True)
            workdir = Path(tmp) / f"s{n}"
            workdir.mkdir()
            results.append(run_scenario(n, size, workdir))
            print(f"bench:   {results[-1].measured}", file=sys.stderr, flush=True)
    finally:
        if args.keep:
            print(f"bench: kept {tmp}", file=sys.stderr)
        else:
            shutil.rmtree(tmp, ignore_errors=True)
    info |= {"load_avg_end": _load(), "total_seconds": round(time.monotonic() - t0, 1)}
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps({"machine": info, "results": [r.as_json() for r in results]}, indent=2))
    print(
        f"\n{size} run, {info['cpu_count']} CPUs, load {info['load_avg_start']} -> {info['load_avg_end']}, "
        f"python {info['python']}, dagster {info['dagster']}, stripe {info['stripe']}, "
        f"commit {(info['git_commit'] or '?')[:10]}{' (dirty)' if info['git_dirty'] else ''}, "
        f"{info['total_seconds']:.0f} s\n"
    )
    print(table(results, judge=size != "smoke"))
    print(f"\nwritten: {args.json}")
    errors = [r for r in results if "error" in r.data]
    return 1 if errors else 0
