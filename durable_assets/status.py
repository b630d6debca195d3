"""A batch's state, read from Dagster's run storage and event log (the checkpoint layer).

One implementation serves ``job status --json``, ``job list`` and the HTTP API. Nothing here is
stored by us except live progress; every step field is derived from Dagster's own events, so the
status can never disagree with what the UI shows.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from dagster import DagsterEventType, DagsterInstance, DagsterRun, DagsterRunStatus, RunsFilter

from durable_assets.errors import InvalidBatchIdError, UnknownBatchError
from durable_assets.kit.cancel import CancelStore
from durable_assets.kit.db import DurableDatabase
from durable_assets.kit.launcher import AUTO_RESUME_ATTEMPT_TAG, AUTO_RESUME_MAX_TAG, AUTO_RESUME_OF_TAG
from durable_assets.kit.progress import ProgressStore
from durable_assets.kit.resources import BATCH_TAG
from durable_assets.refunds.assets import STEPS

BATCH_ID_PATTERN = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")
INPUT_VERSION_TAG_PREFIX = "dagster/input_data_version/"

_RUN_STATUS = {
    DagsterRunStatus.QUEUED: "queued",
    DagsterRunStatus.NOT_STARTED: "queued",
    DagsterRunStatus.MANAGED: "queued",
    DagsterRunStatus.STARTING: "running",
    DagsterRunStatus.STARTED: "running",
    DagsterRunStatus.CANCELING: "canceling",
    DagsterRunStatus.SUCCESS: "succeeded",
    DagsterRunStatus.FAILURE: "failed",
    DagsterRunStatus.CANCELED: "canceled",
}
TERMINAL = {"succeeded", "failed", "canceled"}


def run_status_label(run: DagsterRun) -> str:
    """The contract's status word for one run (a batch's status is its newest run's)."""
    return _RUN_STATUS.get(run.status, "running")


_STEP_EVENTS = {
    DagsterEventType.STEP_START,
    DagsterEventType.STEP_SUCCESS,
    DagsterEventType.STEP_FAILURE,
    DagsterEventType.STEP_SKIPPED,
    DagsterEventType.HANDLED_OUTPUT,
    DagsterEventType.ASSET_MATERIALIZATION,
}


def check_batch_id(batch_id: str) -> str:
    if not BATCH_ID_PATTERN.fullmatch(batch_id or ""):
        raise InvalidBatchIdError(
            f"invalid batch ID {batch_id!r}: use 1-64 characters from A-Z a-z 0-9 _ . -, starting with a "
            "letter or digit"
        )
    return batch_id


def batch_runs(instance: DagsterInstance, batch_id: str) -> list[DagsterRun]:
    """The batch's lineage, oldest first."""
    return list(reversed(instance.get_runs(RunsFilter(tags={BATCH_TAG: batch_id}))))


@dataclass
class _Step:
    name: str
    status: str = "pending"
    executions: int = 0
    started_at: float | None = None
    finished_at: float | None = None
    output_ref: str | None = None
    input_hash: str | None = None


def _iso(ts: float | None) -> str | None:
    return datetime.fromtimestamp(ts, tz=UTC).isoformat().replace("+00:00", "Z") if ts else None


def _input_hash(tags: dict[str, str]) -> str | None:
    inputs = sorted((k, v) for k, v in tags.items() if k.startswith(INPUT_VERSION_TAG_PREFIX))
    if not inputs:
        return None
    return hashlib.sha256(repr(inputs).encode()).hexdigest()[:32]


def _fold_steps(instance: DagsterInstance, runs: Sequence[DagsterRun]) -> dict[str, _Step]:
    steps = {name: _Step(name) for name in STEPS}
    for run in runs:
        run_terminal = _RUN_STATUS.get(run.status) in TERMINAL
        for record in instance.all_logs(run.run_id, of_type=_STEP_EVENTS):
            event = record.dagster_event
            if event is None or event.step_key not in steps:
                continue
            step = steps[event.step_key]
            kind = event.event_type
            if kind == DagsterEventType.STEP_START:
                step.executions += 1
                step.status, step.started_at, step.finished_at = "in_progress", record.timestamp, None
            elif kind == DagsterEventType.STEP_SUCCESS:
                step.status, step.finished_at = "completed", record.timestamp
            elif kind == DagsterEventType.STEP_FAILURE:
                step.status, step.finished_at = "failed", record.timestamp
            elif kind == DagsterEventType.STEP_SKIPPED and step.status != "completed":
                step.status = "skipped"
            elif kind == DagsterEventType.HANDLED_OUTPUT:
                path = event.event_specific_data.metadata.get("path")  # type: ignore[union-attr]
                step.output_ref = str(path.value) if path is not None else step.output_ref
            elif kind == DagsterEventType.ASSET_MATERIALIZATION:
                mat = event.step_materialization_data.materialization
                step.input_hash = _input_hash(dict(mat.tags or {})) or step.input_hash
        if run_terminal:
            for step in steps.values():
                if step.status == "in_progress":  # its worker died or was canceled mid-step
                    step.status = "failed"
    return steps


def step_states(instance: DagsterInstance, runs: Sequence[DagsterRun]) -> dict[str, str]:
    """Each step's status across the lineage (the same fold ``job status`` shows)."""
    return {name: step.status for name, step in _fold_steps(instance, runs).items()}


def is_auto_resume(run: DagsterRun) -> bool:
    """Started by the daemon's automatic resume (a run retry of one inherits its tags, not its parent)."""
    return bool(run.parent_run_id) and run.tags.get(AUTO_RESUME_OF_TAG) == run.parent_run_id


def auto_resume_summary(runs: Sequence[DagsterRun]) -> dict[str, Any] | None:
    """The daemon's automatic resumes of the lineage (``durable_assets.auto_resume``), or None."""
    own = [r for r in runs if is_auto_resume(r)]
    if not own:
        return None
    last = own[-1].tags
    return {
        "attempts": int(last.get(AUTO_RESUME_ATTEMPT_TAG, len(own))),
        "max_attempts": int(last.get(AUTO_RESUME_MAX_TAG, 0)),
        "run_ids": [r.run_id for r in own],
    }


def batch_status(instance: DagsterInstance, batch_id: str, *, include_steps: bool = True) -> dict[str, Any]:
    check_batch_id(batch_id)
    runs = batch_runs(instance, batch_id)
    if not runs:
        raise UnknownBatchError(f"no batch {batch_id!r} in this instance ({instance.root_directory})")
    db = DurableDatabase.for_instance(instance)
    status = _RUN_STATUS.get(runs[-1].status, "running")
    if status == "running" and CancelStore(db).is_requested(batch_id):
        status = "canceling"
    # Progress before steps: an older report with newer step states can only undercount the running
    # step, so percent_complete never goes backwards between two polls (the other order could pair a
    # finished step's report with a snapshot taken before it finished, and drop a step's worth).
    progress = ProgressStore(db).latest(batch_id)
    steps = _fold_steps(instance, runs)
    completed = sum(1 for st in steps.values() if st.status == "completed")
    fraction = 0.0
    if progress is not None and status in ("running", "canceling") and progress.of:
        running = steps.get(STEPS[progress.step - 1]) if 0 < progress.step <= len(STEPS) else None
        if running is not None and running.status == "in_progress":
            fraction = min(progress.done / progress.of, 1.0)
    percent = 100.0 if status == "succeeded" else round(100.0 * (completed + fraction) / len(STEPS), 1)
    out: dict[str, Any] = {
        "id": batch_id,
        "status": status,
        "run_ids": [r.run_id for r in runs],
        "percent_complete": percent,
        "progress": progress.as_dict() if progress else None,
        "auto_resume": auto_resume_summary(runs),
    }
    if include_steps:
        out["steps"] = [
            {
                "step": n,
                "step_name": st.name,
                "status": st.status,
                "executions": st.executions,
                "input_hash": st.input_hash,
                "output_ref": st.output_ref,
                "started_at": _iso(st.started_at),
                "finished_at": _iso(st.finished_at),
            }
            for n, st in enumerate(steps.values(), start=1)
        ]
    return out


def list_batches(instance: DagsterInstance) -> list[dict[str, Any]]:
    """Every batch, newest first (by its newest run)."""
    newest: dict[str, float] = {}
    for _key, batch_ids in instance.get_run_tags(tag_keys=[BATCH_TAG]):
        for bid in batch_ids:
            records = instance.get_run_records(RunsFilter(tags={BATCH_TAG: bid}), limit=1)
            if records:
                newest[bid] = records[0].create_timestamp.timestamp()
    ordered = sorted(newest, key=lambda b: newest[b], reverse=True)
    return [batch_status(instance, b, include_steps=False) for b in ordered]
