"""Scenario 5 — a whole 1,000-invoice batch, process start to exit, ours vs Dagster's default executor.

Ours: `job run` (in-process executor: every step in the run worker's process). Baseline: the same
assets and resources under Dagster's default ``multiprocess_executor`` (a process per step),
started the same way (bench/multiprocess_job.py). Embedded provider, one instance; runs alternate
(ours, baseline, ours, ...) so drift on a shared machine hits both alike.

Issue #25's goal is against the import floor, ``python -c "import dagster, pandas"`` (timed in the
same alternation): a whole batch within 2x of what merely importing its libraries costs. A second
floor, also in the alternation, is Dagster's own: a job of the same shape (seven assets, four
checks) with no work in its steps (bench/dagster_floor.py), which is what any Dagster run of that
shape costs on this instance before it does anything.
"""

from __future__ import annotations

from pathlib import Path

from bench.harness import Result, Size, instance_view, job_env, spread
from tests.support.homes import make_home
from tests.support.processes import JOB, PYTHON, Process

INVOICES = 1_000
REPEATS = {"smoke": 1, "quick": 3, "full": 5}
GOAL = 2.0


def _timed(argv: list[str], env: dict[str, str], log: Path) -> float:
    p = Process(argv, env, log)
    if p.wait(1800) != 0:
        raise RuntimeError(f"batch failed\n{p.tail()}")
    return p.wall_s


def run(size: Size, workdir: Path) -> Result:
    home = make_home(workdir)
    with instance_view(home):  # create the instance's storages once, outside the timings
        pass
    env = job_env(home)
    ours, base, floor, dagster_floor = [], [], [], []
    for i in range(REPEATS[size]):
        floor.append(_timed([str(PYTHON), "-c", "import dagster, pandas"], env, workdir / f"f{i}.log"))
        dagster_floor.append(
            _timed(
                [str(PYTHON), "-c", "from bench.dagster_floor import main; main()", f"floor-{i}"],
                env,
                workdir / f"d{i}.log",
            )
        )
        ours.append(
            _timed(
                [str(JOB), "run", "--id", f"ours-{i}", "--size", str(INVOICES)], env, workdir / f"o{i}.log"
            )
        )
        base.append(
            _timed(
                [
                    str(PYTHON),
                    "-c",
                    "from bench.multiprocess_job import main; main()",
                    f"mp-{i}",
                    str(INVOICES),
                ],
                env,
                workdir / f"m{i}.log",
            )
        )
    o, b, f = spread(ours, 2), spread(base, 2), spread(floor, 2)
    d = spread(dagster_floor, 2)
    to_floor = round(o["median"] / f["median"], 2)
    dagster_to_floor = round(d["median"] / f["median"], 2)
    return Result(
        5,
        f"one {INVOICES:,}-invoice batch, process start to exit (median of {len(ours)})",
        measured=f"`job run` {o['median']:.1f} s ({o['min']:.1f}..{o['max']:.1f})",
        baseline=(
            f"import floor {f['median']:.1f} s; Dagster's floor (the job's shape, no work) "
            f"{d['median']:.1f} s ({dagster_to_floor:.2f}x the import floor); multiprocess executor "
            f"{b['median']:.1f} s ({b['min']:.1f}..{b['max']:.1f})"
        ),
        ratio=(
            f"{to_floor:.2f}x the import floor; {o['median'] / d['median']:.2f}x Dagster's floor; "
            f"{o['median'] / b['median']:.2f} of multiprocess"
        ),
        goal=f"<= {GOAL}x the import floor",
        met=to_floor <= GOAL,
        data={
            "invoices": INVOICES,
            "ours_s": o,
            "multiprocess_s": b,
            "floor_s": f,
            "dagster_floor_s": d,
            "ratio_to_floor": to_floor,
            "dagster_floor_to_import_floor": dagster_to_floor,
            "ratio_to_dagster_floor": round(o["median"] / d["median"], 3),
            "ratio_to_multiprocess": round(o["median"] / b["median"], 3),
        },
    )
