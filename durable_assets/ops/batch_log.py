"""Each batch's log file, and the one line the CLI prints when a batch does not succeed.

Everything Dagster prints while this process runs a batch (its console logger with stack traces,
the compute-log mirror, retries) goes to ``$DAGSTER_HOME/logs/<batch>.log``, appended by every
``job run`` / ``job resume`` of that batch. The user sees one line: which step, why (the error our
code raised, never Dagster's wrapper around it) and where the full log is.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from dagster import DagsterEventType, DagsterInstance, DagsterRun

from durable_assets.kit.console import output_to

#: Dagster's wrappers around the error that says why: skipped when looking for the reason.
_WRAPPERS = {
    "Failure",
    "RetryRequestedFromPolicy",
    "DagsterExecutionStepExecutionError",
    "DagsterUserCodeExecutionError",
}
_MODULE_PREFIX = re.compile(r"^(?:[A-Za-z_][\w]*\.)+(?=[A-Za-z_]\w*: )")


def log_path(instance: DagsterInstance, batch_id: str) -> Path:
    return Path(instance.root_directory) / "logs" / f"{batch_id}.log"


@contextmanager
def batch_output(instance: DagsterInstance, batch_id: str, what: str) -> Iterator[None]:
    """Dagster's output while this process runs the batch goes to the batch's log file."""
    with output_to(log_path(instance, batch_id), f"{what} batch {batch_id}"):
        yield


def batch_failure(instance: DagsterInstance, runs: list[DagsterRun]) -> tuple[str | None, str]:
    """(failed step, reason) from the newest of ``runs`` that recorded a failure.

    Newest first, because this process's run need not be the batch's newest: a worker fenced out by
    a resume reports why it stopped while the resume's run is still going.
    """
    for run in reversed(runs):
        step, reason = failure_reason(instance, run)
        if step or reason:
            return step, reason
    return None, f"the run ended {runs[-1].status.value}" if runs else "no run"


def failure_reason(instance: DagsterInstance, run: DagsterRun) -> tuple[str | None, str]:
    """(failed step key or None, one-line reason, "" if none was recorded) of one run."""
    step, reason = None, ""
    for record in instance.all_logs(
        run.run_id, of_type={DagsterEventType.STEP_FAILURE, DagsterEventType.RUN_FAILURE}
    ):
        event = record.dagster_event
        if event is None:
            continue
        if event.event_type == DagsterEventType.STEP_FAILURE and step is None:
            data = event.step_failure_data
            step = event.step_key
            described = data.user_failure_data.description if data.user_failure_data else None
            reason = described or _error_reason(data.error)
        elif event.event_type == DagsterEventType.RUN_FAILURE and not reason:
            error = getattr(event.event_specific_data, "error", None)
            reason = _error_reason(error) if error else (record.message or "")
    return step, _one_line(reason)


def _error_reason(error: Any) -> str:
    """The first error in the cause chain that is not one of Dagster's wrappers."""
    current = error
    while current is not None and current.cls_name in _WRAPPERS and (current.cause or current.context):
        current = current.cause or current.context
    if current is None:
        return ""
    return _MODULE_PREFIX.sub("", current.message.strip().splitlines()[0] if current.message.strip() else "")


def _one_line(text: str, limit: int = 300) -> str:
    flat = " ".join(text.split())
    return flat if len(flat) <= limit else flat[: limit - 1] + "…"
