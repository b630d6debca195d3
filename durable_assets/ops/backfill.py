"""Backfill a job's daily batches for a range of days, exactly as its daily schedule would name them.

Each day runs in this process, one after another, like ``job run`` (this process is the worker):
a day whose batch already succeeded is skipped, one that exists but did not finish is resumed from
its last committed step, a missing one is started with the schedule's input for that day. Running
the same backfill twice therefore repeats no side effect and finishes what the first left undone.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from datetime import date, timedelta
from enum import IntEnum

from dagster import DagsterInstance, DagsterRunStatus

from durable_assets.errors import DurableError, UsageError
from durable_assets.ops.batch_log import batch_failure
from durable_assets.ops.registry import durable_jobs
from durable_assets.ops.runner import resume_batch, start_batch
from durable_assets.ops.status import batch_runs, batch_status
from durable_assets.ops.status_model import BatchStatus

#: A longer range is almost certainly a typo in a year; split it deliberately if it is not.
MAX_DAYS = 366


class BackfillOutcome(IntEnum):
    """How a range of days ended, worst day first in precedence (the CLI's exit code follows)."""

    SUCCEEDED = 0
    HELD = 1  # every day succeeded, some with items held for a person (exit 4, like `job run`)
    FAILED = 2


def days_between(first: date, last: date) -> list[date]:
    if last < first:
        raise UsageError(f"--to {last} is before --from {first}")
    n = (last - first).days + 1
    if n > MAX_DAYS:
        raise UsageError(f"{n} days requested; backfill at most {MAX_DAYS} at a time")
    return [first + timedelta(days=i) for i in range(n)]


def _why(instance: DagsterInstance, batch_id: str) -> str:
    """``: <step>: <the reason our code gave>`` for a day that did not succeed (its input missing,
    a ceiling, ...): the same one line `job run` ends with, so no day's failure needs the log."""
    step, reason = batch_failure(instance, list(batch_runs(instance, batch_id)))
    return f" at {step}: {' '.join(reason.split())}" if step else f": {' '.join(reason.split())}"


def backfill_days(
    instance: DagsterInstance, days: list[date], say: Callable[[str], None], *, job: str | None = None
) -> BackfillOutcome:
    """Run or resume each day's batch of durable job ``job``; the worst of the days' outcomes: a day
    that succeeded with items held for review is not a clean success, as for `job run`."""
    durable = durable_jobs().get(job)
    if durable.daily is None:
        raise UsageError(f"job {durable.name!r} has no daily schedule to backfill")
    outcome = BackfillOutcome.SUCCEEDED
    for n, day in enumerate(days, 1):
        batch_id = durable.daily.batch_id(day)
        runs = batch_runs(instance, batch_id)
        where = f"day {n}/{len(days)} {batch_id}"
        if runs and runs[-1].status == DagsterRunStatus.SUCCESS:
            held = batch_status(instance, batch_id, include_steps=False).held_for_review
            say(f"{where}: already succeeded{_held(held)}")
            outcome = max(outcome, BackfillOutcome.HELD if held else BackfillOutcome.SUCCEEDED)
            continue
        # A line as the day starts: a day's batch runs for minutes, and silence reads as a hang.
        say(f"{where}: {'resuming' if runs else 'starting'}")
        started = time.monotonic()
        try:
            if runs:
                resume_batch(instance, batch_id)
            else:
                start_batch(instance, batch_id, job=durable.name, input_path=durable.daily.input_path(day))
        except DurableError as exc:
            say(f"{where}: {exc}")
            outcome = BackfillOutcome.FAILED
            continue
        status = batch_status(instance, batch_id, include_steps=False)
        succeeded = status.status == BatchStatus.SUCCEEDED
        say(
            f"{where}: {status.status}{_held(status.held_for_review)} in {time.monotonic() - started:.1f} s"
            + ("" if succeeded else _why(instance, batch_id))
        )
        day_outcome = (
            BackfillOutcome.FAILED
            if not succeeded
            else BackfillOutcome.HELD
            if status.held_for_review
            else BackfillOutcome.SUCCEEDED
        )
        outcome = max(outcome, day_outcome)
    return outcome


def _held(held: int) -> str:
    return f", {held} held for review (`job status --id` names where)" if held else ""
