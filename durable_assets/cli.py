"""The ``job`` command (CONTRACT.md): thin argument handling over runner, status and the servers.

Exit codes: 0 succeeded; 1 the batch ended failed or canceled; 2 usage error or invalid input;
3 conflict (existing ID on run, unknown ID, live lease). Errors print one actionable line, never a
traceback (``--verbose`` adds it for debugging).
"""

from __future__ import annotations

import argparse
import json
import sys
import threading
import traceback
from collections.abc import Callable, Sequence
from typing import Any, NoReturn, TextIO

from durable_assets.errors import DurableError, UsageError

EXIT_OK, EXIT_FAILED, EXIT_USAGE, EXIT_CONFLICT = 0, 1, 2, 3


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        self.print_usage(sys.stderr)
        self.exit(EXIT_USAGE, f"{self.prog}: error: {message}\n")


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(prog="job", description="Crash-safe, exactly-once refund batches on Dagster.")
    p.add_argument("--verbose", action="store_true", help="say which instance is used; tracebacks on errors")
    sub = p.add_subparsers(dest="command", required=True, parser_class=_Parser)

    run = sub.add_parser("run", help="start batch ID and run it to the end")
    run.add_argument("--id", required=True)
    run.add_argument("--invoices", help="CSV or Parquet file (schema in README); default: synthetic")
    run.add_argument("--size", type=int, default=1000, help="synthetic batch size (default 1000)")

    for name, text in (
        ("resume", "continue batch ID from its last committed step"),
        ("cancel", "ask batch ID to stop at the next step boundary or refund chunk"),
    ):
        sp = sub.add_parser(name, help=text)
        sp.add_argument("--id", required=True)

    status = sub.add_parser("status", help="the batch's state")
    status.add_argument("--id", required=True)
    status.add_argument("--json", action="store_true")

    lst = sub.add_parser("list", help="batches, newest first")
    lst.add_argument("--json", action="store_true")

    prune = sub.add_parser("prune", help="archive, then delete, old finished batches (docs/retention.md)")
    prune.add_argument("--dry-run", action="store_true", help="list what would go; change nothing")
    prune.add_argument("--completed-days", type=float, help="keep succeeded batches this long (default 30)")
    prune.add_argument(
        "--failed-days", type=float, help="keep failed/canceled batches this long (default 90)"
    )
    prune.add_argument("--ledger-days", type=float, help="keep idempotency keys this long (default 365)")
    prune.add_argument("--archive-dir", help="where archives go (default $DAGSTER_HOME/archive)")
    prune.add_argument("--json", action="store_true")
    bf = sub.add_parser("backfill", help="run or finish the daily batches daily-YYYY-MM-DD of a range")
    bf.add_argument("--from", dest="first", required=True, type=_day, help="first day, YYYY-MM-DD")
    bf.add_argument("--to", dest="last", required=True, type=_day, help="last day, YYYY-MM-DD (inclusive)")

    serve = sub.add_parser("serve", help="the status HTTP API")
    serve.add_argument("--host", default="127.0.0.1")
    serve.add_argument("--port", type=int, default=8000, help="0 picks a free port (printed at start)")

    provider = sub.add_parser("provider", help="the Stripe-compatible payment simulator")
    psub = provider.add_subparsers(dest="provider_command", required=True, parser_class=_Parser)
    ps = psub.add_parser("serve", help="serve the simulator over HTTP")
    ps.add_argument("--host", default="127.0.0.1")
    ps.add_argument("--port", type=int, default=12111)
    ps.add_argument("--db", default="simulator.db", help="SQLite file holding charges, refunds and keys")
    ps.add_argument("--latency-ms", type=float, default=0.0)
    ps.add_argument("--error-rate", type=float, default=0.0, help="fraction answered 500 before processing")
    ps.add_argument(
        "--lost-response-rate",
        type=float,
        default=0.0,
        help="fraction committed, then the connection dropped",
    )
    ps.add_argument("--rate-limit", type=float, default=None, help="requests/s; beyond it 429 + Retry-After")
    ps.add_argument("--seed", type=int, default=None)
    return p


def _day(text: str) -> Any:
    from datetime import date

    try:
        return date.fromisoformat(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a YYYY-MM-DD date: {text!r}") from None


def _instance(verbose: bool) -> Any:
    from dagster import DagsterInstance

    from durable_assets.runner import resolve_dagster_home

    home, why = resolve_dagster_home()
    if verbose:
        print(f"instance: {home} (from {why})", file=sys.stderr)
    # Dagster's SQLite storages create their tables on first open; two `job` processes starting
    # together on a new instance collide there. A file lock makes first-open one at a time.
    import fcntl

    with open(home / ".durable-open.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        instance = DagsterInstance.get()
        _ = (instance.run_storage, instance.event_log_storage, instance.schedule_storage)
        from durable_assets.kit.db import DurableDatabase

        DurableDatabase.for_instance(instance)
    return instance


def _watch(instance: Any, batch_id: str, stop: threading.Event, out: TextIO) -> None:
    """Live progress while this process runs the batch: a bar on a terminal, plain lines otherwise."""
    from durable_assets.errors import UnknownBatchError
    from durable_assets.status import batch_status

    tty = out.isatty()
    last = ""
    while not stop.wait(0.25):
        try:
            st = batch_status(instance, batch_id, include_steps=False)
        except UnknownBatchError:
            continue
        except Exception:  # progress display must never break the batch
            continue
        p = st.get("progress")
        if not p:
            continue
        line = f"step {p['step']}/{p['total']} {p['label']}"
        if p["of"]:
            frac = p["done"] / p["of"]
            bar = "#" * int(frac * 30)
            line += f" [{bar:<30}] {p['done']}/{p['of']}" if tty else f" {p['done']}/{p['of']}"
        if line != last:
            out.write(("\r" + line.ljust(100)) if tty else line + "\n")
            out.flush()
            last = line
    if tty and last:
        out.write("\n")


def _with_progress(instance: Any, batch_id: str, fn: Callable[[], Any]) -> Any:
    stop = threading.Event()
    watcher = threading.Thread(target=_watch, args=(instance, batch_id, stop, sys.stderr), daemon=True)
    watcher.start()
    try:
        return fn()
    finally:
        stop.set()
        watcher.join(timeout=2)


def _finish(instance: Any, batch_id: str) -> int:
    from durable_assets.status import batch_status

    st = batch_status(instance, batch_id)
    print(f"batch {batch_id}: {st['status']}")
    if st["status"] != "succeeded":
        failed = next((s for s in st["steps"] if s["status"] == "failed"), None)
        if failed:
            print(
                f"  step {failed['step']} ({failed['step_name']}) failed; see `job status --id {batch_id}` "
                f"and the run {st['run_ids'][-1]} in the Dagster UI",
                file=sys.stderr,
            )
        return EXIT_FAILED
    base = instance.root_directory
    print(f"  report: {base}/batches/{batch_id}/refund_report.csv")
    print(f"  quarantine: {base}/batches/{batch_id}/quarantine.csv")
    print(f"  status: job status --id {batch_id}")
    return EXIT_OK


def _print_status(st: dict[str, Any], as_json: bool) -> None:
    if as_json:
        print(json.dumps(st, indent=2))
        return
    print(f"batch {st['id']}: {st['status']} ({st['percent_complete']}%)  runs: {len(st['run_ids'])}")
    p = st.get("progress")
    if p and st["status"] in ("running", "canceling"):
        print(f"  now: step {p['step']}/{p['total']} {p['label']} {p['done']}/{p['of']}")
    auto = st.get("auto_resume")
    if auto:
        print(
            f"  automatically resumed (attempt {auto['attempts']} of {auto['max_attempts']}) after its "
            f"worker was lost: run {auto['run_ids'][-1]}"
        )
    for s in st.get("steps", []):
        print(
            f"  {s['step']}. {s['step_name']:<20} {s['status']:<12} executions={s['executions']}"
            f"  finished={s['finished_at'] or '-'}"
        )


def _prune(instance: Any, args: argparse.Namespace) -> int:
    from durable_assets.retention import policy_from_env, prune_batches

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
    if out["runs_per_s"]:
        print(f"took {out['seconds']} s ({out['runs_per_s']} runs/s)")
    return EXIT_OK


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return _dispatch(args)
    except DurableError as exc:
        print(f"error: {exc}", file=sys.stderr)
        if args.verbose:
            traceback.print_exc()
        return exc.exit_code
    except KeyboardInterrupt:
        print("interrupted; `job resume` continues the batch", file=sys.stderr)
        return EXIT_FAILED


def _dispatch(args: argparse.Namespace) -> int:
    if args.command == "provider":
        from durable_assets.payments.simulator import serve as serve_simulator

        serve_simulator(
            args.host,
            args.port,
            args.db,
            latency_ms=args.latency_ms,
            error_rate=args.error_rate,
            lost_response_rate=args.lost_response_rate,
            rate_limit=args.rate_limit,
            seed=args.seed,
        )
        return EXIT_OK
    if args.command == "serve":
        from durable_assets.api import serve as serve_api

        serve_api(_instance(args.verbose), args.host, args.port)
        return EXIT_OK

    from durable_assets import runner, status

    if getattr(args, "id", None) is not None:
        status.check_batch_id(args.id)
    instance = _instance(args.verbose)
    if args.command == "run":
        if args.size < 1:
            raise UsageError("--size must be at least 1")
        if args.invoices:
            from durable_assets.refunds.validation import read_invoice_file

            read_invoice_file(args.invoices)  # fail fast with exit 2 before a run exists
        _with_progress(
            instance,
            args.id,
            lambda: runner.start_batch(instance, args.id, invoices=args.invoices, size=args.size),
        )
        return _finish(instance, args.id)
    if args.command == "resume":
        run = _with_progress(instance, args.id, lambda: runner.resume_batch(instance, args.id))
        if run is None:
            print(f"batch {args.id}: already succeeded; nothing to do")
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
    if args.command == "backfill":
        from durable_assets.backfill import backfill_days, days_between

        days = days_between(args.first, args.last)
        return EXIT_OK if backfill_days(instance, days, print) else EXIT_FAILED
    if args.command == "list":
        batches = status.list_batches(instance)
        if args.json:
            print(json.dumps(batches, indent=2))
        else:
            for b in batches:
                print(
                    f"{b['id']:<30} {b['status']:<10} {b['percent_complete']:>5}%  runs={len(b['run_ids'])}"
                )
        return EXIT_OK
    raise UsageError(f"unknown command {args.command}")


if __name__ == "__main__":
    sys.exit(main())
