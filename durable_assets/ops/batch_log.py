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

from dagster import AssetCheckSeverity, DagsterEvent, DagsterEventType, DagsterInstance, DagsterRun

from durable_assets.kit.runtime import step_of_shard
from durable_assets.ops.console import output_to

#: Dagster's wrappers around the error that says why: skipped when looking for the reason.
_WRAPPERS = {
    "Failure",
    "RetryRequestedFromPolicy",
    "DagsterExecutionStepExecutionError",
    "DagsterUserCodeExecutionError",
}
_MODULE_PREFIX = re.compile(r"^(?:[A-Za-z_][\w]*\.)+(?=[A-Za-z_]\w*: )")
#: Failing items a failed check's reason names: enough to start looking, short enough for one line.
CHECK_ITEMS = 5
#: Characters of one failing item in that line (an item is a check's own sentence about one record).
CHECK_ITEM_CHARS = 80
#: Metadata keys whose list values a check's failing items are read from: ``examples`` or
#: ``examples_<kind>`` (the convention both pipelines' checks follow; ``<kind>`` prefixes the item).
EXAMPLES_KEY = "examples"


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
    """(failed step key or None, one-line reason, "" if none was recorded) of one run.

    A step failed by a blocking asset check is reported as the check's asset step, with the check's
    name, severity and failing items: Dagster's own message stops at a newline before the names.
    A shard of a distributed run (``<step>__shard_k_of_N``) is reported as its step.
    """
    step, reason = None, ""
    checks: dict[str, list[Any]] = {}  # check step key -> its failed blocking evaluations
    for record in instance.all_logs(
        run.run_id,
        of_type={
            DagsterEventType.ASSET_CHECK_EVALUATION,
            DagsterEventType.STEP_FAILURE,
            DagsterEventType.RUN_FAILURE,
        },
    ):
        event = record.dagster_event
        if event is None:
            continue
        if event.event_type == DagsterEventType.ASSET_CHECK_EVALUATION:
            evaluation = event.event_specific_data
            if blocks(evaluation) and event.step_key:
                checks.setdefault(event.step_key, []).append(evaluation)
        elif event.event_type == DagsterEventType.STEP_FAILURE and step is None:
            failed = checks.get(event.step_key or "")
            if failed:
                step, reason = failed[0].asset_key.path[-1], describe_failed_checks(failed)
            else:  # a shard of a distributed run is told as its step, the one a person knows
                step = step_of_shard(event.step_key) if event.step_key else None
                reason = step_failure_reason(event)
        elif event.event_type == DagsterEventType.RUN_FAILURE and not reason:
            error = getattr(event.event_specific_data, "error", None)
            reason = _error_reason(error) if error else (record.message or "")
    return step, _one_line(reason, limit=CHECK_ITEMS * (CHECK_ITEM_CHARS + 2) + 200 if checks else 300)


def step_failure_reason(event: DagsterEvent) -> str:
    """Why a step failed: the description our code gave, else the first error that is not Dagster's."""
    data = event.step_failure_data
    described = data.user_failure_data.description if data.user_failure_data else None
    return _one_line(described or _error_reason(data.error))


def blocks(evaluation: Any) -> bool:
    """A check evaluation that stops the run: failed, ERROR severity, blocking."""
    return (
        evaluation is not None
        and not evaluation.passed
        and evaluation.severity == AssetCheckSeverity.ERROR
        and bool(evaluation.blocking)
    )


def describe_failed_checks(evaluations: list[Any]) -> str:
    """``blocking check NAME failed (ERROR): item; item; ... (+N more)``, for each failed check.

    Items are the lists under the check's ``examples`` / ``examples_<kind>`` metadata, else its
    description; at most :data:`CHECK_ITEMS` of them over all the checks named.
    """
    parts, room = [], CHECK_ITEMS
    for evaluation in evaluations:
        items = check_items(evaluation)
        shown, room = items[:room], max(room - len(items), 0)
        text = f"blocking check {evaluation.check_name} failed ({evaluation.severity.value})"
        if shown:
            more = f" (+{len(items) - len(shown)} more)" if len(items) > len(shown) else ""
            text += ": " + "; ".join(shown) + more
        parts.append(text)
    return "; ".join(parts)


def check_items(evaluation: Any) -> list[str]:
    """The failing items a check evaluation names, each cut to :data:`CHECK_ITEM_CHARS`."""
    items: list[str] = []
    for key, value in (evaluation.metadata or {}).items():
        listed = getattr(value, "value", value)
        if not isinstance(listed, list) or not (key == EXAMPLES_KEY or key.startswith(EXAMPLES_KEY + "_")):
            continue
        kind = key[len(EXAMPLES_KEY) + 1 :]
        items += [f"{kind} {item}" if kind else str(item) for item in listed]
    if not items and evaluation.description:
        items = [evaluation.description]
    return [_one_line(item, limit=CHECK_ITEM_CHARS) for item in items]


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
