"""The ``job`` command (docs/contract.md): thin argument handling over runner, status and the servers.

Exit codes: 0 succeeded; 1 the batch ended failed or canceled; 2 usage error or invalid input;
3 conflict (existing ID on run, unknown ID, live lease); 4 ``run``/``resume`` finished (succeeded)
but left items held for review, which a person must decide. Errors print one actionable line,
never a traceback (``--verbose`` adds it for debugging).
"""

from __future__ import annotations

import argparse
import gc
import json
import math
import sys
import threading
import traceback
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, NoReturn

from durable_assets.errors import BatchInterruptedError, DurableError, UsageError
from durable_assets.kit.runtime import DEFAULT_SHARDS, MAX_SHARDS, ExecutorKind

if TYPE_CHECKING:  # imported where used: `job --help` stays fast
    from durable_assets.kit.runtime import ConnectionBounds
    from durable_assets.ops.status_model import BatchStatusModel

EXIT_OK, EXIT_FAILED, EXIT_USAGE, EXIT_CONFLICT = 0, 1, 2, 3
#: The batch succeeded but some of its items wait for a person (status JSON ``needs_review``).
EXIT_NEEDS_REVIEW = 4
#: Ctrl-C (128 + SIGINT); a SIGTERM while a batch runs is 143 (BatchInterruptedError.exit_code).
EXIT_INTERRUPTED = 130


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        """One line, like every other error; the usage is one `--help` away."""
        self.exit(EXIT_USAGE, f"{self.prog}: error: {message} (see `{self.prog} --help`)\n")


def _default_job_name(argv: Sequence[str]) -> str | None:
    """The location's default job, named in `--help` only: importing the code location is the cost
    of a help text that is right for a user's location; every other command parses without it."""
    if not {"-h", "--help"} & set(argv):
        return None
    try:
        from durable_assets.ops.registry import durable_jobs

        return durable_jobs().default.name
    except Exception:  # a location that does not import: the help stays generic, the command says why
        return None


def build_parser(default_job: str | None = None) -> argparse.ArgumentParser:
    default = f"default {default_job}" if default_job else "default: the location's first registered job"
    p = _Parser(prog="job", description="Crash-safe, exactly-once batch jobs on Dagster.")
    p.add_argument("--verbose", action="store_true", help="say which instance is used; tracebacks on errors")
    sub = p.add_subparsers(dest="command", required=True, parser_class=_Parser)

    run = sub.add_parser("run", help="start batch ID and run it to the end")
    run.add_argument("--job", metavar="NAME", help=f"the durable job (see `job jobs`; {default})")
    run.add_argument("--id", required=True, type=_batch_id)
    run.add_argument(
        "--input",
        "--invoices",
        dest="input",
        metavar="PATH",
        help="CSV or Parquet file (schema in README); default: synthetic",
    )
    run.add_argument(
        "--size",
        type=_size,
        default=1000,
        help=f"synthetic batch size, 1..{MAX_SIZE:,} (default 1000)",
    )

    run.add_argument(
        "--executor",
        choices=[k.value for k in ExecutorKind],
        default=ExecutorKind.IN_PROCESS.value,
        help="in_process (default: this process runs every step) or celery (`job worker`s run them)",
    )
    run.add_argument(
        "--shards",
        type=_shards,
        default=DEFAULT_SHARDS,
        help=f"with --executor celery: tasks each mutating step is split into, 1..{MAX_SHARDS} "
        f"(default {DEFAULT_SHARDS})",
    )

    init = sub.add_parser(
        "init-home", help="write an instance folder's dagster.yaml (SQLite unless told) and say how to use it"
    )
    init.add_argument(
        "dir", metavar="DIR", help="the instance folder, absolute or relative (made if missing)"
    )
    where = init.add_mutually_exclusive_group()
    where.add_argument(
        "--postgres", metavar="URL", help="store in this Postgres database (written in the file)"
    )
    where.add_argument(
        "--postgres-from-env",
        action="store_true",
        help="store in the Postgres database DAGSTER_PG_URL names when the instance is opened",
    )
    init.add_argument(
        "--distributed",
        action="store_true",
        help="for `job worker` and `--executor celery` (Postgres; from DAGSTER_PG_URL unless --postgres)",
    )
    init.add_argument("--force", action="store_true", help="replace a dagster.yaml that says something else")

    worker = sub.add_parser("worker", help="a worker of the distributed executor (a Celery worker)")
    worker.add_argument(
        "--concurrency",
        type=_concurrency,
        default=2,
        help="steps this worker runs at once, 1..64 (default 2)",
    )

    resume = sub.add_parser("resume", help="continue batch ID from its last committed step")
    resume.add_argument("--id", required=True, type=_batch_id)
    resume.add_argument(
        "--wait",
        nargs="?",
        type=_non_negative,
        const=WAIT_DEFAULT,
        default=None,
        metavar="SECONDS",
        help="if a worker still holds the batch's lease, wait up to SECONDS (default: twice "
        "DURABLE_LEASE_TTL_S) for it to lapse (a dead or frozen worker's does), then take over",
    )
    resume.add_argument(
        "--override-guardrails",
        action="store_true",
        help="use this shell's ceilings and limits instead of those pinned at `job run`, and record it",
    )
    resume.add_argument(
        "--accept-code-change",
        action="store_true",
        help="continue on deployed code that changed in a step with recorded effects since the batch "
        "started, and record it; a step that would derive another key for an item still stops",
    )
    cancel = sub.add_parser(
        "cancel", help="ask batch ID to stop at the next step boundary or side-effect chunk"
    )
    cancel.add_argument("--id", required=True, type=_batch_id)

    status = sub.add_parser("status", help="the batch's state")
    status.add_argument("--id", required=True, type=_batch_id)
    status.add_argument("--json", action="store_true")

    lst = sub.add_parser("list", help="batches, newest first (the newest 50 unless told otherwise)")
    lst.add_argument("--job", metavar="NAME", help="only the batches of this durable job")
    page = lst.add_mutually_exclusive_group()
    page.add_argument(
        "--limit", type=_list_limit, default=50, metavar="N", help="at most N batches (default 50)"
    )
    page.add_argument("--all", action="store_true", help="every batch (its cost grows with the history)")
    lst.add_argument("--before", type=_batch_id, metavar="ID", help="only batches older than batch ID")
    lst.add_argument("--json", action="store_true")

    jobs = sub.add_parser("jobs", help="the registered durable jobs")
    jobs.add_argument("--json", action="store_true")

    decide = sub.add_parser(
        "decide", help="record (or withdraw) a person's decision for one held item (README: decisions)"
    )
    decide.add_argument("--job", metavar="NAME", help=f"the item's durable job ({default})")
    decide.add_argument("--item", required=True, help="the item as the job's report names it")
    decide.add_argument("decision", nargs="?", help="one of the job's decisions (`job jobs` lists them)")
    decide.add_argument("--note", help="why (required with a decision); every report that applies it says it")
    decide.add_argument("--withdraw", action="store_true", help="withdraw the decision in force for the item")

    decisions = sub.add_parser("decisions", help="the decisions in force, oldest first")
    decisions.add_argument("--job", metavar="NAME", help="only this durable job's")
    decisions.add_argument("--json", action="store_true")

    prune = sub.add_parser("prune", help="archive, then delete, old finished batches (docs/retention.md)")
    prune.add_argument("--dry-run", action="store_true", help="list what would go; change nothing")
    prune.add_argument("--completed-days", type=_days, help="keep succeeded batches this long (default 30)")
    prune.add_argument(
        "--failed-days", type=_days, help="keep failed/canceled batches this long (default 90)"
    )
    prune.add_argument("--ledger-days", type=_days, help="keep idempotency keys this long (default 365)")
    prune.add_argument(
        "--archive-dir", type=_directory, help="where archives go (default $DAGSTER_HOME/archive)"
    )
    prune.add_argument("--json", action="store_true")
    bf = sub.add_parser(
        "backfill", help="run or finish a job's daily batches (e.g. daily-YYYY-MM-DD) of a range"
    )
    bf.add_argument("--job", metavar="NAME", help=f"a durable job with a daily schedule ({default})")
    bf.add_argument("--from", dest="first", required=True, type=_day, help="first day, YYYY-MM-DD")
    bf.add_argument("--to", dest="last", required=True, type=_day, help="last day, YYYY-MM-DD (inclusive)")

    serve = sub.add_parser("serve", help="the status HTTP API")
    serve.add_argument("--host", type=_host, default="127.0.0.1")
    serve.add_argument("--port", type=_port, default=8000, help="0 picks a free port (printed at start)")
    serve.add_argument(
        "--cors-origin",
        action="append",
        default=[],
        metavar="ORIGIN",
        help="allow a browser page on ORIGIN (scheme://host[:port]) to call the API; repeatable, "
        "added to DURABLE_API_CORS_ORIGINS (default: no cross-origin access)",
    )

    location = sub.add_parser(
        "serve-location",
        help="a code location's gRPC code server, restarted when it dies (for the webserver and daemon)",
    )
    location.add_argument(
        "--module",
        metavar="M",
        help="the location's module (default: DURABLE_CODE_LOCATION, else durable_assets.definitions)",
    )
    location.add_argument(
        "--working-directory", metavar="DIR", help="the folder the module is imported from (default: here)"
    )
    location.add_argument(
        "--location-name", metavar="NAME", help="its name in the workspace (default: the module)"
    )
    location.add_argument("--host", type=_host, default="127.0.0.1")
    location.add_argument(
        "--port", type=_port, default=4266, help="default 4266; 0 picks a free port (printed at start)"
    )

    provider = sub.add_parser("provider", help="the Stripe-compatible payment simulator")
    psub = provider.add_subparsers(dest="provider_command", required=True, parser_class=_Parser)
    ps = psub.add_parser("serve", help="serve the simulator over HTTP")
    ps.add_argument("--host", type=_host, default="127.0.0.1")
    ps.add_argument("--port", type=_port, default=12111, help="0 picks a free port (printed at start)")
    ps.add_argument(
        "--db", type=_db_file, default="simulator.db", help="SQLite file holding charges, refunds and keys"
    )
    ps.add_argument("--latency-ms", type=_non_negative, default=0.0)
    ps.add_argument(
        "--error-rate", type=_fraction, default=0.0, help="fraction answered 500 before processing"
    )
    ps.add_argument(
        "--lost-response-rate",
        type=_fraction,
        default=0.0,
        help="fraction committed, then the connection dropped",
    )
    ps.add_argument(
        "--rate-limit", type=_positive, default=None, help="requests/s; beyond it 429 + Retry-After"
    )
    ps.add_argument("--seed", type=int, default=None)
    ps.add_argument(
        "--api-key",
        dest="api_keys",
        action="append",
        default=[],
        metavar="KEY",
        help="an API key to accept (repeatable; never a live-mode sk_live_/rk_live_ key: exit 2); "
        "without it, any sk_test_ key is accepted",
    )
    _verbose_after_the_command(p)
    return p


def _verbose_after_the_command(parser: argparse.ArgumentParser) -> None:
    """``job run --id x --verbose`` as well as ``job --verbose run ...``: every subcommand accepts it,
    and leaves the top-level value alone when it is not given there (SUPPRESS)."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                sub.add_argument(
                    "--verbose", action="store_true", default=argparse.SUPPRESS, help="as `job --verbose`"
                )
                _verbose_after_the_command(sub)


# --- option types: every value is checked while parsing, before an instance or a batch exists ------

#: ``--wait`` without SECONDS: twice the lease TTL, resolved when the command runs.
WAIT_DEFAULT = -1.0

#: The synthetic generators' bound (the first steps' configs allow no more).
MAX_SIZE = 10_000_000


def _day(text: str) -> Any:
    from datetime import date

    try:
        return date.fromisoformat(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a YYYY-MM-DD date: {text!r}") from None


def _batch_id(text: str) -> str:
    from durable_assets.ops.status import BATCH_ID_PATTERN

    if not BATCH_ID_PATTERN.fullmatch(text):
        raise argparse.ArgumentTypeError(
            f"invalid batch ID {text!r}: use 1-64 characters from A-Z a-z 0-9 _ . -, "
            "starting with a letter or digit"
        )
    return text


def _integer(text: str, low: int, high: int) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a whole number: {text!r}") from None
    if not low <= value <= high:
        raise argparse.ArgumentTypeError(f"{value} is out of range: use {low}..{high}")
    return value


def _size(text: str) -> int:
    return _integer(text, 1, MAX_SIZE)


def _list_limit(text: str) -> int:
    return _integer(text, 1, 100_000)


def _shards(text: str) -> int:
    return _integer(text, 1, MAX_SHARDS)


def _concurrency(text: str) -> int:
    return _integer(text, 1, 64)


def _port(text: str) -> int:
    return _integer(text, 0, 65535)


def _number(text: str, *, low: float, high: float = math.inf, low_open: bool = False) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not math.isfinite(value) or value < low or (low_open and value == low) or value > high:
        bound = f"> {low:g}" if low_open else f">= {low:g}"
        raise argparse.ArgumentTypeError(
            f"{text!r} is out of range: use a number {bound}"
            + (f" and <= {high:g}" if high < math.inf else "")
        )
    return value


def _days(text: str) -> float:
    return _number(text, low=0)


def _non_negative(text: str) -> float:
    return _number(text, low=0)


def _positive(text: str) -> float:
    return _number(text, low=0, low_open=True)


def _fraction(text: str) -> float:
    return _number(text, low=0, high=1)


def _host(text: str) -> str:
    import socket

    if not text.strip():
        raise argparse.ArgumentTypeError("empty host")
    try:
        socket.getaddrinfo(text, None, type=socket.SOCK_STREAM)
    except (OSError, UnicodeError) as exc:
        raise argparse.ArgumentTypeError(f"cannot resolve host {text!r} ({exc})") from None
    return text


def _directory(text: str) -> str:
    """A directory that exists and is writable, or one that can be created (its nearest existing
    ancestor is a writable directory)."""
    import os
    from pathlib import Path

    path = Path(text).expanduser().absolute()
    existing = next((p for p in (path, *path.parents) if p.exists()), None)
    if existing is None or not existing.is_dir():
        raise argparse.ArgumentTypeError(f"{text!r} is not a directory ({existing} is a file)")
    if not os.access(existing, os.W_OK | os.X_OK):
        raise argparse.ArgumentTypeError(f"{text!r}: {existing} is not writable")
    return text


def _db_file(text: str) -> str:
    """A file to open or create: not a directory, in a directory that exists."""
    from pathlib import Path

    path = Path(text).expanduser().absolute()
    if path.is_dir():
        raise argparse.ArgumentTypeError(f"{text!r} is a directory, not a database file")
    if not path.parent.is_dir():
        raise argparse.ArgumentTypeError(f"{text!r}: directory {path.parent} does not exist")
    return text


def _instance(verbose: bool) -> Any:

    from durable_assets.ops.runner import resolve_dagster_home

    home, why = resolve_dagster_home()
    if verbose:
        print(f"instance: {home} (from {why})", file=sys.stderr)
    # Dagster's SQLite storages create their tables on first open; two `job` processes starting
    # together on a new instance collide there. A file lock makes first-open one at a time.
    import fcntl

    with open(home / ".durable-open.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        instance = _open_instance(home)
        _ = (instance.run_storage, instance.event_log_storage, instance.schedule_storage)
        from durable_assets.kit.runtime import DurableDatabase

        DurableDatabase.for_instance(instance)
    _collect_garbage_again()
    return instance


def _open_instance(home: Any) -> Any:
    """Dagster's instance, with a ``dagster.yaml`` it refuses named in one line (its own error lists
    every key it would have accepted)."""
    from dagster import DagsterInstance, DagsterInvalidConfigError

    from durable_assets.errors import InstanceConfigError

    try:
        return DagsterInstance.from_config(str(home))
    except DagsterInvalidConfigError as exc:
        first = " ".join(str(exc).split()).split(" Expected:", 1)[0].rstrip(".")
        raise InstanceConfigError(
            f"{home / 'dagster.yaml'} is not a configuration Dagster accepts: {first}; fix it (see "
            "dagster_home/dagster.yaml), or move it away to get the project's"
        ) from exc


def _collect_garbage_again() -> None:
    """Undo :func:`main`'s ``gc.disable()`` once the imports are done, before any work: what the
    imports built lives as long as the process, so it is frozen out of every later collection."""
    gc.freeze()
    gc.enable()


def _long_lived(instance: Any) -> Any:
    """A command that runs a batch or serves requests makes thousands of storage calls: on Postgres
    it holds a connection per storage instead of opening one per call (see ``hold_connections``).
    Never the worker's parent process: its pool children fork from it and open their own."""
    from durable_assets.kit.runtime import hold_connections

    hold_connections(instance)
    return instance


def _one_task_at_a_time() -> ConnectionBounds:
    """The database connections of a process that runs one step at a time, or none: a `job worker`'s
    pool children and a distributed run's orchestrator (``DURABLE_WORKER_DB_POOL``, read here only)."""
    from durable_assets.kit.runtime import DistributedSettings, one_task_at_a_time

    return one_task_at_a_time(DistributedSettings.current().worker_db_pool)


def _with_progress(instance: Any, batch_id: str, fn: Callable[[], Any]) -> Any:
    from durable_assets.ops.console import ClosedPipeSafe, user_stream

    # Opened before the run: it keeps reaching the terminal while Dagster's output goes to the log.
    out = ClosedPipeSafe(user_stream())
    stop = threading.Event()
    from durable_assets.ops.events import ProgressFollower
    from durable_assets.ops.progress_lines import watch
    from durable_assets.ops.settings import ProgressSettings

    follower = ProgressFollower(instance, batch_id)  # before the run: only the runs it starts are shown
    interval = ProgressSettings.current().progress_log_interval_s
    watcher = threading.Thread(target=watch, args=(follower, stop, out, interval), daemon=True)
    watcher.start()
    try:
        from durable_assets.ops.interrupts import run_interruptible

        return run_interruptible(instance, batch_id, fn)  # Ctrl-C / SIGTERM: stop at a safe point
    finally:
        stop.set()
        watcher.join(timeout=2)
        out.close()


def _finish(instance: Any, batch_id: str) -> int:
    """The end-of-batch summary (summary.py) and the exit code it means."""
    from durable_assets.ops.status import batch_runs, batch_status
    from durable_assets.ops.status_model import BatchStatus
    from durable_assets.ops.summary import batch_summary, provider_line, spec_for

    st = batch_status(instance, batch_id)
    runs = batch_runs(instance, batch_id)
    spec = spec_for(runs[-1].job_name) if runs else None
    print(batch_summary(instance, batch_id, st.status, spec).render())
    provider = provider_line(st.provider)
    if provider:
        print(f"  {provider}")
    print(f"  status: job status --id {batch_id}")
    if st.status != BatchStatus.SUCCEEDED:
        _print_failure(instance, batch_id, st)
        return EXIT_FAILED
    if st.needs_review:
        print(f"exit {EXIT_NEEDS_REVIEW}: finished, {st.held_for_review} held for review", file=sys.stderr)
        return EXIT_NEEDS_REVIEW
    return EXIT_OK


def _print_failure(instance: Any, batch_id: str, st: BatchStatusModel) -> None:
    """One line: the step, the reason our code gave, and the log with everything else."""
    from durable_assets.ops.batch_log import batch_failure, log_path
    from durable_assets.ops.disk import batch_disk_full, full_path_of_reason
    from durable_assets.ops.status_model import BatchStatus

    runs = [r for r in (instance.get_run_by_id(run_id) for run_id in st.run_ids) if r is not None]
    step_key, reason = batch_failure(instance, runs)
    where = ""
    if step_key:
        number = next((s.step for s in st.steps or [] if s.step_name == step_key), None)
        where = f" at step {number} ({step_key})" if number else f" at {step_key}"
    log = log_path(instance, batch_id)
    full = full_path_of_reason(reason, log.parent.parent)
    if full is not None:  # the step recorded why it stopped: the disk is full
        raise batch_disk_full(batch_id, full, number if step_key else None)
    print(
        f"error: batch {batch_id} {st.status}{where}: {reason.rstrip('.')}; full log: {log}"
        + (
            f"; continue with `job resume --id {batch_id}`"
            if st.status == BatchStatus.CANCELED and "job resume" not in reason  # advice once
            else ""
        ),
        file=sys.stderr,
    )


def _print_status(st: BatchStatusModel, as_json: bool) -> None:
    from durable_assets.ops.progress_lines import progress_line
    from durable_assets.ops.summary import provider_line

    if as_json:
        print(json.dumps(st.as_json(), indent=2))  # the edge: the model becomes the contract's JSON here
        return
    print(f"batch {st.id} ({st.job}): {st.status} ({st.percent_complete}%)  runs: {len(st.run_ids)}")
    provider = provider_line(st.provider)
    if provider:
        print(f"  {provider}")
    p = st.progress
    if p is not None:
        now = "ended" if st.status.terminal else "now"
        print(f"  {now}: {progress_line(p, tty=False)}")
    why = next((s.error for s in st.steps or [] if s.error), None)
    if why and st.status.terminal:
        print(f"  why: {why}")
    if st.needs_review:
        print(f"  needs review: {st.held_for_review} held for a person")
    for d in st.decisions or []:
        print(f"  decided by a person: {d.item} {d.decision} ({d.decided_by}, {d.decided_at}): {d.note}")
    if st.guardrails is not None:
        from durable_assets.ops.guardrails import describe_pinned

        for line in describe_pinned(st.guardrails):
            print(line)
    if st.code is not None:
        from durable_assets.ops.code_changes import describe_code

        for line in describe_code(st.code):
            print(line)
    auto = st.auto_resume
    if auto is not None:
        print(
            f"  automatically resumed (attempt {auto.attempts} of {auto.max_attempts}) after its "
            f"worker was lost: run {auto.run_ids[-1]}"
        )
    for f in st.files:  # where a person opens them, from any host (`GET /runs/{ID}/files/{name}`)
        print(f"  {f.label}: {f.uri}")
    steps = st.steps or []
    name_width = max([20, *(len(s.step_name) for s in steps)])  # a long step name widens the column
    number_width = len(str(len(steps)))
    for s in steps:
        print(
            f"  {s.step:>{number_width}}. {s.step_name:<{name_width}} {s.status:<12} "
            f"executions={s.executions}  finished={s.finished_at or '-'}"
        )


def _print_jobs(as_json: bool) -> int:
    from durable_assets.ops.registry import durable_jobs

    jobs = durable_jobs()
    if as_json:
        print(json.dumps([_job_dict(j, default=j is jobs.default) for j in jobs], indent=2))
        return EXIT_OK
    for job in jobs:
        print(f"{job.name}{' (default)' if job is jobs.default else ''}: {job.description}")
        for n, step in enumerate(job.steps, 1):
            effect = f"  [side effects: {step.effect_scope}]" if step.mutates else ""
            print(f"  {n}. {step.key:<24} {step.label}{effect}")
        if job.daily:
            print(f"  schedule: {job.daily.schedule_name} ({job.daily.cron} UTC, ships stopped)")
        for word, what in job.decisions.items():
            print(f"  decision `job decide --job {job.name} --item ITEM {word}`: {what}")
    return EXIT_OK


def _print_decisions(instance: Any, job: str | None, as_json: bool) -> int:
    from durable_assets.ops.decisions import decisions_in_force

    found = decisions_in_force(instance, job)
    if as_json:
        print(json.dumps([d.as_json() for d in found], indent=2))
    elif not found:
        print("no decisions in force")
    for d in [] if as_json else found:
        print(
            f"{d.job:<18} {d.item:<24} {d.decision:<22} {d.decided_on}  {d.decided_by}  {d.account}: {d.note}"
        )
    return EXIT_OK


def _job_dict(job: Any, *, default: bool) -> dict[str, Any]:
    return {
        "name": job.name,
        "description": job.description,
        "default": default,
        "steps": [
            {"step": n, "step_name": s.key, "label": s.label, "effect_scope": s.effect_scope}
            for n, s in enumerate(job.steps, 1)
        ],
        "schedule": job.daily.schedule_name if job.daily else None,
        "decisions": dict(job.decisions),
    }


def _say_plan(skipped: Sequence[str], to_run: Sequence[str]) -> None:
    """What a resume re-executes: the steps it skips (committed) and the ones it runs."""
    if skipped:
        print(f"resume: skipping {len(skipped)} committed step(s): {', '.join(skipped)}", file=sys.stderr)
    if to_run:
        print(f"resume: running {', '.join(to_run)}", file=sys.stderr)


def _say_now(line: str) -> None:
    """A line that reaches a pipe or a file at once, not when the buffer fills (backfill's days)."""
    print(line, flush=True)


def _prune(instance: Any, args: argparse.Namespace) -> int:
    from durable_assets.ops.retention import policy_from_env, prune_batches

    policy = policy_from_env(args.completed_days, args.failed_days, args.ledger_days)
    report = prune_batches(instance, policy=policy, archive_dir=args.archive_dir, dry_run=args.dry_run)
    out = report.as_dict()
    if args.json:
        print(json.dumps(out, indent=2))
        return EXIT_OK
    verb = "would prune" if report.dry_run else "pruned"
    print(f"{verb} {len(report.batches)} batches ({report.runs} runs); archives in {out['archive_dir']}")
    for b in out["batches"]:
        print(f"  {b['id']:<30} {b['status']:<10} ended {b['ended_at']}  runs={b['runs']}")
    for s in out["skipped"]:
        print(f"  skipped {s['id']}: {s['reason']}")
    if out["in_progress"]:
        print(f"  kept {len(out['in_progress'])} batches with a run in progress")
    gone = "would be removed" if report.dry_run else "removed"
    print(f"ledger: {report.ledger_keys} idempotency keys older than {policy.ledger_days:g} days {gone}")
    if not report.dry_run:
        print(
            f"storage: {report.stored.objects} stored objects ({report.stored.bytes} bytes) "
            "of the pruned batches removed"
        )
    if out["runs_per_s"]:
        print(f"took {out['seconds']} s ({out['runs_per_s']} runs/s)")
    return EXIT_OK


def main(argv: Sequence[str] | None = None) -> int:
    # A command's imports (Dagster, its storages, the code location) build about a million objects
    # and no garbage, and the cyclic collector would scan them over and over: off until they are
    # done (``_instance``, or before the simulator serves). Measured: `job status --json` 1.37 ->
    # 0.87 s, a 1,000-invoice `job run` 4.8 -> 3.9 s (bench 11 and 5).
    gc.disable()
    from durable_assets.ops.console import ClosedPipeSafe, echo_worker_output

    ClosedPipeSafe.install()  # `job list | head -3`: stop writing quietly, finish, keep the exit code
    args = build_parser(_default_job_name(sys.argv[1:] if argv is None else argv)).parse_args(argv)
    echo_worker_output(args.verbose)
    try:
        return _dispatch_minding_the_disk(args)
    except BatchInterruptedError as exc:  # not an error: what the user asked for, and how to go on
        print(exc, file=sys.stderr)
        return exc.exit_code
    except DurableError as exc:
        print(f"error: {exc}", file=sys.stderr)
        if args.verbose:
            traceback.print_exc()
        return exc.exit_code
    except KeyboardInterrupt:  # before a batch runs (while it runs, ops/interrupts.py handles it)
        print("interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    except Exception as exc:  # a bug or an environment we did not foresee: still one line
        print(
            f"error: unexpected {type(exc).__name__}: {' '.join(str(exc).split())}"
            + ("" if args.verbose else " (run with --verbose for the traceback)"),
            file=sys.stderr,
        )
        if args.verbose:
            traceback.print_exc()
        return EXIT_FAILED
    finally:
        gc.enable()  # a command that opened no instance (`job jobs`), or main() called by a test
        sys.stdout.flush()  # while the pipe guard is on: the interpreter's own flush would complain


def _dispatch_minding_the_disk(args: argparse.Namespace) -> int:
    """A full disk (ops/disk.py): reading commands still answer; a batch this process runs ends
    with the one documented line naming its step, the full path and ``job resume``."""
    from durable_assets.ops import disk

    if args.command in ("status", "list"):
        return disk.reading_when_full(lambda: _dispatch(args), _home)
    if args.command not in ("run", "resume"):
        return _dispatch(args)
    home = _home()
    step_now = lambda: _current_step(_instance(False), args.id)  # noqa: E731
    with disk.full_disk_ends_batch(args.id, home, step_now, home / "logs" / f"{args.id}.log"):
        return _dispatch(args)


def _home() -> Any:
    from durable_assets.ops.runner import resolve_dagster_home

    return resolve_dagster_home()[0]


def _current_step(instance: Any, batch_id: str) -> int | None:
    """The step a batch stopped in: the first one not completed (UnknownBatchError before it existed)."""
    from durable_assets.ops.status import batch_status
    from durable_assets.ops.status_model import StepStatus

    steps = batch_status(instance, batch_id).steps or []
    return next((s.step for s in steps if s.status != StepStatus.COMPLETED), None)


def _check_before_instance(args: argparse.Namespace) -> None:
    """What parsing alone cannot check, done before the instance is opened or a batch is created."""
    if args.command in ("run", "resume", "backfill", "serve"):
        check_worker_env()
    # `job list` reads its batches' steps from their runs (ops/job_shape.py): it imports the code
    # location only to check a --job it was given.
    if args.command in ("status", "list", "cancel", "serve", "prune"):
        from durable_assets.ops.registry import check_code_location

        check_code_location()  # these never import the location: a missing one is named all the same
    if args.command in ("run", "backfill") or (args.command == "list" and args.job is not None):
        from durable_assets.ops.registry import durable_jobs

        job = durable_jobs().get(args.job)  # an unknown --job: exit 2 before anything is opened
        if args.command == "run" and args.input and job.check_input is not None:
            job.check_input(args.input)  # unreadable or malformed: exit 2, and the ID stays unused
    if args.command == "backfill":
        from durable_assets.ops.backfill import days_between

        days_between(args.first, args.last)
    if args.command == "decide":
        from durable_assets.ops.decisions import DecisionRequest, check_request

        check_request(DecisionRequest(args.job, args.item, args.decision, args.note, args.withdraw))
    if args.command == "prune":
        from durable_assets.ops.retention import policy_from_env

        policy_from_env(args.completed_days, args.failed_days, args.ledger_days)


def check_worker_env() -> None:
    """A malformed variable fails here, naming it and what it accepts, not as a traceback from the
    step (or the import) that reads it: every variable is checked, whichever command reads it
    (each layer's sections, then the code location's, whose pipelines declare their own)."""
    from durable_assets.kit.runtime import arm
    from durable_assets.ops.registry import durable_jobs
    from durable_assets.settings import check_environment

    check_environment()
    durable_jobs()  # imports the code location: its pipelines' sections are defined (and read) there
    check_environment()
    arm()  # a test's malformed DURABLE_CRASH_AT is exit 2 here, not a traceback at its first pass


def _init_home(args: argparse.Namespace) -> int:
    from durable_assets.ops.init_home import HomeKind, describe, init_home
    from durable_assets.settings import InstanceSettings

    if args.distributed:
        kind = HomeKind.DISTRIBUTED
    elif args.postgres or args.postgres_from_env:
        kind = HomeKind.POSTGRES
    else:
        kind = HomeKind.SQLITE
    result = init_home(args.dir, kind, args.postgres, force=args.force)
    for line in describe(result, kind, args.postgres, InstanceSettings.current().dagster_pg_url):
        print(line)
    return EXIT_OK


def _serve_location(args: argparse.Namespace) -> int:
    """Only the instance the code server will serve is resolved here (its dagster.yaml made or
    checked, as by every command); the location itself is imported by the code server alone."""
    from durable_assets.ops.runner import resolve_dagster_home
    from durable_assets.ops.serve_location import location, supervise
    from durable_assets.settings import InstanceSettings

    module = args.module or InstanceSettings.current().code_location
    where = location(module, args.working_directory, args.location_name, args.host, args.port)
    home, why = resolve_dagster_home()
    print(
        f"serve-location: instance {home} ({why}); run the webserver and the daemon with DAGSTER_HOME={home}",
        file=sys.stderr,
        flush=True,
    )
    _collect_garbage_again()
    return supervise(where, home)


def _require_shared_storage(args: argparse.Namespace) -> None:
    """The distributed executor's workers share only the database: never on a SQLite instance."""
    from durable_assets.ops.instance import check_shared_storage
    from durable_assets.ops.runner import resolve_dagster_home

    if args.command == "worker":
        check_shared_storage(
            resolve_dagster_home()[0], "`job worker`", "run batches without --executor celery"
        )
    elif args.command == "run" and args.executor == ExecutorKind.CELERY.value:
        check_shared_storage(resolve_dagster_home()[0], "--executor celery", "leave --executor celery out")


def _dispatch(args: argparse.Namespace) -> int:
    if args.command == "init-home":
        return _init_home(args)
    if args.command == "serve-location":
        return _serve_location(args)
    _check_before_instance(args)
    _require_shared_storage(args)
    if args.command == "provider":
        # The one import of the testing package from the runtime: loaded only to run the simulator.
        from durable_assets_testing.simulator import Faults, build_server
        from durable_assets_testing.simulator import serve as serve_simulator

        faults = Faults(
            latency_ms=args.latency_ms,
            error_rate=args.error_rate,
            lost_response_rate=args.lost_response_rate,
            rate_limit=args.rate_limit,
        )
        _collect_garbage_again()
        try:
            server = build_server(
                args.host, args.port, args.db, faults, seed=args.seed, api_keys=args.api_keys
            )
            serve_simulator(server)
        except OSError as exc:  # bind or database open: what the user changes is --port or --db
            raise UsageError(
                f"cannot serve on {args.host}:{args.port} with --db {args.db}: {exc.strerror or exc}; "
                "pick another --port (0 = any free port) or --db"
            ) from exc
        return EXIT_OK
    if args.command == "serve":
        from durable_assets.ops.api import ApiSettings
        from durable_assets.ops.api import serve as serve_api

        # Bad values: exit 2 before the instance is opened.
        settings = ApiSettings.from_env(cors_origins=args.cors_origin)
        serve_api(_long_lived(_instance(args.verbose)), args.host, args.port, settings)
        return EXIT_OK

    if args.command == "jobs":
        return _print_jobs(args.json)
    if args.command == "worker":
        from durable_assets.kit.runtime import run_worker
        from durable_assets.ops.registry import durable_jobs, prepare_distributed_jobs

        _instance(args.verbose)  # DAGSTER_HOME resolved and checked, as for every command
        # The code location, imported once here, before the pool forks: each child inherits it
        # instead of importing it in its first task (~2 s of a batch's critical path per child),
        # and its jobs as a run with the default shard count executes them.
        durable_jobs()
        prepare_distributed_jobs()
        run_worker(args.concurrency, _one_task_at_a_time(), _home())
        return EXIT_OK

    from durable_assets.ops import runner, status

    if args.command in ("run", "resume", "cancel", "backfill", "prune", "decide"):
        from durable_assets.ops.sqlite_locks import wait_for_write_locks

        # A frozen process's SQLite write lock would hang these commands: bounded, named, exit 3.
        wait_for_write_locks(runner.resolve_dagster_home()[0])
    if args.command == "run" and args.executor == ExecutorKind.CELERY.value:
        from durable_assets.kit.runtime import bound_connections

        bound_connections(_one_task_at_a_time())  # it orchestrates: the workers run every step
    instance = _instance(args.verbose)
    if args.command in ("run", "resume", "backfill"):
        from durable_assets.kit.runtime import remember_existing_partitions

        remember_existing_partitions(_long_lived(instance))  # it runs batches, a partition each
    if args.command == "run":
        _with_progress(
            instance,
            args.id,
            lambda: runner.start_batch(
                instance,
                args.id,
                job=args.job,
                input_path=args.input,
                size=args.size,
                executor=ExecutorKind(args.executor),
                shards=args.shards,
            ),
        )
        return _finish(instance, args.id)
    if args.command == "resume":
        from durable_assets.ops.settings import lease_ttl_s

        wait = None if args.wait is None else (2 * lease_ttl_s() if args.wait == WAIT_DEFAULT else args.wait)
        run = _with_progress(
            instance,
            args.id,
            lambda: runner.resume_batch(
                instance,
                args.id,
                on_plan=_say_plan,
                wait_s=wait,
                override_guardrails=args.override_guardrails,
                accept_code_change=args.accept_code_change,
                say=lambda line: print(line, file=sys.stderr),
            ),
        )
        if run is None:
            held = status.batch_status(instance, args.id, include_steps=False).held_for_review
            note = f" ({held} held for review)" if held else ""
            print(f"batch {args.id}: already succeeded{note}; nothing to do")
            return EXIT_OK
        return _finish(instance, args.id)
    if args.command == "cancel":
        print(f"batch {args.id}: {runner.cancel_batch(instance, args.id)}")
        return EXIT_OK
    if args.command == "status":
        _print_status(status.batch_status(instance, args.id), args.json)
        return EXIT_OK
    if args.command == "prune":
        return _prune(instance, args)
    if args.command == "decide":
        from durable_assets.ops.decisions import DecisionRequest, decide

        request = DecisionRequest(args.job, args.item, args.decision, args.note, args.withdraw)
        print(decide(instance, request))
        return EXIT_OK
    if args.command == "decisions":
        return _print_decisions(instance, args.job, args.json)
    if args.command == "backfill":
        from durable_assets.ops.backfill import backfill_days, days_between

        days = days_between(args.first, args.last)  # checked already; cheap
        from durable_assets.ops.backfill import BackfillOutcome

        exit_of = {
            BackfillOutcome.SUCCEEDED: EXIT_OK,
            BackfillOutcome.HELD: EXIT_NEEDS_REVIEW,
            BackfillOutcome.FAILED: EXIT_FAILED,
        }
        return exit_of[backfill_days(instance, days, _say_now, job=args.job)]
    if args.command == "list":
        page = status.list_batches(
            instance, job=args.job, limit=None if args.all else args.limit, before=args.before
        )
        if args.json:
            print(json.dumps([b.as_json() for b in page.batches], indent=2))
        else:
            for b in page.batches:
                review = f"  needs review: {b.held_for_review}" if b.needs_review else ""
                print(
                    f"{b.id:<30} {b.job:<18} {b.status:<10} {b.percent_complete:>5}%  "
                    f"created {b.created_at}  updated {b.updated_at}  runs={len(b.run_ids)}{review}"
                )
        if page.has_more:  # on stderr: `--json` stays one JSON document
            count = f"{page.more} more batches" if page.more else "more batches"
            print(
                f"{count}: `job list --before {page.batches[-1].id}` for the next page, or --all",
                file=sys.stderr,
            )
        return EXIT_OK
    raise UsageError(f"unknown command {args.command}")


if __name__ == "__main__":
    sys.exit(main())
