"""Scenario 11 — how long the `job` command makes a person wait, against the import floor.

The floor is ``python -c "import dagster, pandas"``: what any Dagster-and-pandas program pays before
it does anything. Issue #25's goals: a usage error, `job status --json` and `job list` within 1.3x
of it (a usage error should not import Dagster at all). Every command runs as a user runs it, a
fresh process start to exit, against an instance holding one finished batch; floor and commands
alternate, so drift on a shared machine hits them alike, and the median of each is reported.
Issue #37: `job list` must not grow with history, so it is also timed against an instance holding
:data:`MANY` batches (made as runs in the instance, as nightly batches leave them, not run).
"""

from __future__ import annotations

from pathlib import Path

from bench.harness import Result, Size, instance_view, job, job_env, spread
from tests.support.homes import make_home
from tests.support.processes import JOB, PYTHON, Process

REPEATS = {"smoke": 1, "quick": 5, "full": 9}
#: Batches in the instance the history-bound `job list` reads.
MANY = {"smoke": 20, "quick": 1000, "full": 1000}
GOAL = 1.3
BATCH = "cli-latency"

#: The commands timed, as typed; each must exit with the code given (2 is the usage error).
COMMANDS: dict[str, tuple[list[str], int]] = {
    "usage error": (["run"], 2),
    "status --json": (["status", "--id", BATCH, "--json"], 0),
    "list": (["list"], 0),
}


def _wall(argv: list[str], env: dict[str, str], log: Path, exit_code: int) -> float:
    p = Process(argv, env, log)
    rc = p.wait(300)
    if rc != exit_code:
        raise RuntimeError(f"`{' '.join(argv[1:])}` exited {rc}, not {exit_code}\n{p.tail()}")
    return p.wall_s


def _history(home: Path, batches: int) -> None:
    """``batches`` batches of the refund job, one failed run each, written straight to the instance."""
    from dagster import DagsterInstance
    from dagster._core.execution.api import create_execution_plan

    from durable_assets.definitions import refund_batch_job
    from durable_assets.kit.tags import BATCH_TAG

    job_def = refund_batch_job()
    config = {"ops": {"invoices": {"config": {"size": 5}}}}
    plan = create_execution_plan(job_def, config)
    ids = [f"night-{n:04d}" for n in range(batches)]
    with instance_view(home) as view:
        instance: DagsterInstance = view.instance
        instance.add_dynamic_partitions("batches", ids)
        for bid in ids:
            tags = {BATCH_TAG: bid, "dagster/partition": bid}
            run = instance.create_run_for_job(
                job_def=job_def, execution_plan=plan, run_config=config, tags=tags
            )
            instance.report_run_failed(run, message="bench history")


def run(size: Size, workdir: Path) -> Result:
    home = make_home(workdir)
    with instance_view(home):  # the instance's storages exist before anything is timed
        pass
    env = job_env(home)
    first = job(["run", "--id", BATCH, "--size", "50"], env, workdir, timeout=600)
    if first.proc.returncode != 0:
        raise RuntimeError(f"the batch to read failed\n{first.tail()}")
    many = make_home(workdir / "history")
    _history(many, MANY[size])
    many_env = job_env(many)
    listing_many = f"list, {MANY[size]:,} batches"
    floor: list[float] = []
    times: dict[str, list[float]] = {name: [] for name in [*COMMANDS, listing_many]}
    for i in range(REPEATS[size]):
        floor.append(_wall([str(PYTHON), "-c", "import dagster, pandas"], env, workdir / f"floor{i}.log", 0))
        for name, (args, code) in COMMANDS.items():
            times[name].append(_wall([str(JOB), *args], env, workdir / f"{name.split()[0]}{i}.log", code))
        times[listing_many].append(_wall([str(JOB), "list"], many_env, workdir / f"many{i}.log", 0))
    f = spread(floor, 2)
    stats = {name: spread(samples, 2) for name, samples in times.items()}
    ratios = {name: round(s["median"] / f["median"], 2) for name, s in stats.items()}
    return Result(
        11,
        f"`job` commands, process start to exit (median of {len(floor)})",
        measured=", ".join(f"{name} {s['median']:.2f} s" for name, s in stats.items()),
        baseline=f"`import dagster, pandas` {f['median']:.2f} s ({f['min']:.2f}..{f['max']:.2f})",
        ratio=", ".join(f"{name} {r:.2f}x" for name, r in ratios.items()),
        goal=f"each <= {GOAL}x the floor",
        met=all(r <= GOAL for r in ratios.values()),
        data={"floor_s": f, "commands_s": stats, "ratio_to_floor": ratios},
    )
