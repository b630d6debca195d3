"""A batch's state, read from Dagster's run storage and event log (the checkpoint layer).

One implementation serves ``job status --json``, ``job list`` and the HTTP API. Nothing here is
stored by us except live progress; every step field is derived from Dagster's own events, so the
status can never disagree with what the UI shows.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from dagster import DagsterEventType, DagsterInstance, DagsterRun, DagsterRunStatus, RunRecord, RunsFilter

from durable_assets.errors import InvalidBatchIdError, UnknownBatchError
from durable_assets.kit.runtime import (
    AUTO_RESUME_ATTEMPT_TAG,
    AUTO_RESUME_MAX_TAG,
    AUTO_RESUME_OF_TAG,
    BATCH_TAG,
    CANCELED_KEY,
    DEFAULT_NAMESPACE,
    HELD_FOR_REVIEW_KEY,
    INPUT_DATA_VERSION_TAG_PREFIX,
    WORKER_LOST_CANCELED,
    WORKER_LOST_TAG,
    AccountBindings,
    CancelStore,
    DurableDatabase,
    ItemDecisions,
    Lease,
    LeaseStore,
    Progress,
    ProgressStore,
    check_shard_again,
    holder_is_gone,
    now,
    owner_pid,
    skip_shard_checks,
    step_of_shard,
)
from durable_assets.ops.batch_log import blocks, describe_failed_checks, step_failure_reason
from durable_assets.ops.code_changes import code_model
from durable_assets.ops.guardrails import guardrails_model
from durable_assets.ops.job_shape import JobShape, job_shape, stored_code_versions, stored_steps
from durable_assets.ops.settings import lease_ttl_s
from durable_assets.ops.status_model import (
    BATCH_ID_REGEX,
    AutoResumeModel,
    BatchFileModel,
    BatchStatus,
    BatchStatusModel,
    DecisionModel,
    ProgressModel,
    ProviderModel,
    StepModel,
    StepStatus,
)
from durable_assets.ops.stored_files import batch_files

BATCH_ID_PATTERN = re.compile(BATCH_ID_REGEX)
#: The name of the error a step stops with when its batch was canceled (kit/cancel.py). Only for runs
#: recorded before the kit marked such a failure with ``CANCELED_KEY`` metadata: their failures carry
#: nothing but the text, and their batches must still show canceled steps as skipped.
_LEGACY_CANCELED_ERROR = "BatchCanceledError"
#: Dagster run statuses whose worker may still be alive (or not started yet); ops/reexecution.py's
#: ``LIVE``, which imports this module.
_MAY_BE_LIVE = frozenset(
    {
        DagsterRunStatus.QUEUED,
        DagsterRunStatus.NOT_STARTED,
        DagsterRunStatus.STARTING,
        DagsterRunStatus.STARTED,
        DagsterRunStatus.CANCELING,
    }
)
#: Percent shown for a batch whose every step may be done but whose end is not recorded yet (the
#: last step's count at its end, the moment between its success and the run's): 100 means succeeded.
NOT_YET_DONE_PERCENT = 99.9


def run_status_label(run: DagsterRun) -> BatchStatus:
    """The contract's status word for one run (a batch's status is its newest run's)."""
    return BatchStatus.of_run(run.status)


_STEP_EVENTS = {
    DagsterEventType.STEP_START,
    DagsterEventType.STEP_SUCCESS,
    DagsterEventType.STEP_FAILURE,
    DagsterEventType.STEP_SKIPPED,
    DagsterEventType.HANDLED_OUTPUT,
    DagsterEventType.ASSET_MATERIALIZATION,
    DagsterEventType.ASSET_CHECK_EVALUATION,
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


def lineage_records(instance: DagsterInstance, batch_ids: Sequence[str]) -> dict[str, list[RunRecord]]:
    """The lineages of ``batch_ids`` (each oldest first; empty for an unknown batch), in one query.

    A record carries its run and its times (created, updated, started), so a status needs no
    further read of the run storage: a page of ``job list`` costs one query here, not three per batch.
    """
    found: dict[str, list[RunRecord]] = {bid: [] for bid in batch_ids}
    if not found:
        return found
    for record in instance.get_run_records(RunsFilter(tags={BATCH_TAG: list(found)})):
        lineage = found.get(record.dagster_run.tags.get(BATCH_TAG, ""))
        if lineage is not None:
            lineage.append(record)
    return {bid: list(reversed(records)) for bid, records in found.items()}


@dataclass
class _Step:
    name: str
    status: StepStatus = StepStatus.PENDING
    executions: int = 0
    started_at: float | None = None
    finished_at: float | None = None
    output_ref: str | None = None
    input_hash: str | None = None
    run_id: str | None = None  # the run of its latest start
    sharded_in: str | None = None  # the run whose shards started it (its merge's start is no new one)
    metadata: dict[str, Any] = field(default_factory=dict)  # its latest materialization's, plain values
    error: str | None = None  # why it failed (its own error), while it stays failed
    # The failures of its asset's checks since it last started, by check step key: a blocking
    # check that failed stops the run at this step, whatever Dagster calls the next one.
    check_failures: dict[str, str] = field(default_factory=dict)

    @property
    def effective_status(self) -> StepStatus:
        """Its own status, but failed when a check of its asset failed after it completed."""
        if self.status == StepStatus.COMPLETED and self.check_failures:
            return StepStatus.FAILED
        return self.status

    @property
    def reason(self) -> str | None:
        """Why the step failed, or why the batch stopped at it (for ``error`` in the status JSON)."""
        if self.check_failures and self.effective_status == StepStatus.FAILED:
            return "; ".join(self.check_failures.values())
        return self.error

    def model(self, n: int) -> StepModel:
        """The step as the status JSON shows it, the ``n``-th of its job: its effective status and
        why, its times in ISO 8601."""
        return StepModel(
            step=n,
            step_name=self.name,
            status=self.effective_status,
            error=self.reason,
            executions=self.executions,
            input_hash=self.input_hash,
            output_ref=self.output_ref,
            started_at=_iso(self.started_at),
            finished_at=_iso(self.finished_at),
        )


def _iso(ts: float | None) -> str | None:
    return datetime.fromtimestamp(ts, tz=UTC).isoformat().replace("+00:00", "Z") if ts else None


def _input_hash(tags: dict[str, str]) -> str | None:
    inputs = sorted((k, v) for k, v in tags.items() if k.startswith(INPUT_DATA_VERSION_TAG_PREFIX))
    if not inputs:
        return None
    return hashlib.sha256(repr(inputs).encode()).hexdigest()[:32]


def _plain(value: Any) -> Any:
    """A metadata value as JSON-able Python (paths and URLs as strings, JSON as itself)."""
    inner = getattr(value, "value", value)
    if inner is None or isinstance(inner, bool | int | float | str | dict | list):
        return inner
    return str(inner)


def _stopped_by_cancel(event: Any) -> bool:
    """Whether a step failure is the kit's stop on a cancel (``CANCELED_KEY``), not a failure."""
    data = getattr(event.event_specific_data, "user_failure_data", None)
    marker = (getattr(data, "metadata", None) or {}).get(CANCELED_KEY)
    if getattr(marker, "value", marker) is True:
        return True
    # Fallback for failures recorded before the marker existed (older batches still in storage):
    # the error's text names the exception. Never needed for a failure the kit records now.
    error = getattr(event.event_specific_data, "error", None)
    text = f"{getattr(data, 'description', '') or ''} {getattr(error, 'message', '') or ''}"
    return _LEGACY_CANCELED_ERROR in text


def _fold_check_event(step: _Step, check_step: str, event: Any) -> None:
    kind = event.event_type
    if kind == DagsterEventType.STEP_START:
        step.check_failures.pop(check_step, None)  # run again: its last verdict is void
    elif kind == DagsterEventType.ASSET_CHECK_EVALUATION:
        evaluation = event.event_specific_data
        if blocks(evaluation):
            step.check_failures[check_step] = describe_failed_checks([evaluation])
        else:
            step.check_failures.pop(check_step, None)
    elif kind == DagsterEventType.STEP_FAILURE and check_step not in step.check_failures:
        # The check itself raised: it never gave a verdict, and the run stops all the same.
        step.check_failures[check_step] = f"check {check_step} failed: {step_failure_reason(event)}"


def _fold_steps(
    instance: DagsterInstance, runs: Sequence[DagsterRun], shape: JobShape | None = None
) -> dict[str, _Step]:
    shape = shape or job_shape(instance, runs)
    steps = {name: _Step(name) for name in shape.step_keys}
    check_steps = shape.check_steps
    for run in runs:
        run_status = BatchStatus.of_run(run.status)
        for record in _step_events(instance, run.run_id):
            event = record.dagster_event
            if event is None or event.step_key is None:
                continue
            kind = event.event_type
            checked = steps.get(check_steps.get(event.step_key, ""))
            if checked is not None:
                _fold_check_event(checked, event.step_key, event)
                continue
            if event.step_key not in steps:
                # A shard of a distributed run counts as its step: started when a shard starts,
                # stopped when one stops; the merged step (same key as the step) completes it.
                shard_of = steps.get(step_of_shard(event.step_key))
                if shard_of is not None:
                    _fold_shard_event(shard_of, event, record.timestamp, run.run_id)
                continue
            step = steps[event.step_key]
            merging = step.status == StepStatus.IN_PROGRESS and step.sharded_in == run.run_id
            if kind == DagsterEventType.STEP_START and merging:
                step.sharded_in = None  # the merge of the shards that started it: the same execution
            elif kind == DagsterEventType.STEP_START:
                step.executions += 1
                step.status = StepStatus.IN_PROGRESS
                step.started_at, step.finished_at = record.timestamp, None
                step.run_id = run.run_id
                step.sharded_in = None
                step.error = None
                step.check_failures.clear()  # its checks run again after it
            elif kind == DagsterEventType.STEP_SUCCESS:
                step.status, step.finished_at = StepStatus.COMPLETED, record.timestamp
            elif kind == DagsterEventType.STEP_FAILURE:
                # A step stopped by a cancel did not fail: it is left for `job resume` to run.
                step.status = StepStatus.SKIPPED if _stopped_by_cancel(event) else StepStatus.FAILED
                step.finished_at = record.timestamp
                step.error = step_failure_reason(event)
            elif kind == DagsterEventType.STEP_SKIPPED and step.status != StepStatus.COMPLETED:
                step.status, step.error = StepStatus.SKIPPED, None
            elif kind == DagsterEventType.HANDLED_OUTPUT:
                path = event.event_specific_data.metadata.get("path")  # type: ignore[union-attr]
                step.output_ref = str(path.value) if path is not None else step.output_ref
            elif kind == DagsterEventType.ASSET_MATERIALIZATION:
                mat = event.step_materialization_data.materialization
                step.input_hash = _input_hash(dict(mat.tags or {})) or step.input_hash
                step.metadata = {str(k): _plain(v) for k, v in mat.metadata.items()}
        if run_status.terminal:
            for step in steps.values():
                if step.status == StepStatus.IN_PROGRESS:  # its worker died or was canceled mid-step
                    step.status = (
                        StepStatus.SKIPPED if run_status == BatchStatus.CANCELED else StepStatus.FAILED
                    )
    return steps


def _step_events(instance: DagsterInstance, run_id: str) -> Sequence[Any]:
    """The run's step events. A read of a shard whose schema check was skipped
    (:func:`list_batches`) that fails is read again the way Dagster reads a shard it does not know."""
    try:
        return instance.all_logs(run_id, of_type=_STEP_EVENTS)
    except Exception:
        check_shard_again(instance, run_id)
        return instance.all_logs(run_id, of_type=_STEP_EVENTS)


def _fold_shard_event(step: _Step, event: Any, at: float, run_id: str) -> None:
    """One shard's event, told as its step's: the step a person knows, never the shard asset.

    A shard stopped by a cancel leaves its step skipped, as a step of an unsharded run is; a shard
    that failed leaves it failed (which a sibling's cancel never turns back into skipped), with the
    shard's reason. Once a shard of a run stopped, the merge cannot run in that run: a sibling that
    starts after it neither reopens the step nor counts as another execution.
    """
    kind = event.event_type
    if step.status == StepStatus.COMPLETED:
        # The merge ran, so every shard had succeeded: a later shard event is a stale execution's
        # (a frozen worker woken after its shard was sent again), not news about the step.
        return
    stopped = step.status in (StepStatus.FAILED, StepStatus.SKIPPED) and step.run_id == run_id
    if kind == DagsterEventType.STEP_START and step.status != StepStatus.IN_PROGRESS and not stopped:
        step.executions += 1
        step.status = StepStatus.IN_PROGRESS
        step.started_at, step.finished_at = at, None
        step.run_id = step.sharded_in = run_id
        step.error = None
        step.check_failures.clear()  # its checks run again after its merge
    elif kind == DagsterEventType.STEP_FAILURE and step.status != StepStatus.FAILED:
        step.status = StepStatus.SKIPPED if _stopped_by_cancel(event) else StepStatus.FAILED
        step.finished_at = at
        step.error = step_failure_reason(event)


def held_for_review(steps: Sequence[Any]) -> int:
    """The batch's items held for a person: the last step (in step order) reporting the key decides.

    ``steps`` are per-step metadata mappings in step order (see :data:`HELD_FOR_REVIEW_KEY`).
    """
    held = 0
    for metadata in steps:
        value = metadata.get(HELD_FOR_REVIEW_KEY)
        if isinstance(value, int | float) and not isinstance(value, bool):
            held = int(value)
    return held


def _ended_at(steps: list[_Step]) -> int:
    """The step number a batch that did not succeed ended at: the first failed or skipped step (a
    check's failure counts as its asset's step), else the first not completed."""
    stopped = (StepStatus.FAILED, StepStatus.SKIPPED)
    ended = next((n for n, st in enumerate(steps, 1) if st.effective_status in stopped), None)
    if ended is None:
        ended = next((n for n, st in enumerate(steps, 1) if st.status != StepStatus.COMPLETED), len(steps))
    return ended


def _final_progress(
    status: BatchStatus,
    steps: list[_Step],
    report: tuple[Progress, str] | None,
    labels: Mapping[str, str],
    lost: bool = False,
) -> Progress:
    """A finished batch's progress is its final state: where it ended, and how far that step got."""
    total = len(steps)
    if status == BatchStatus.SUCCEEDED:
        return Progress(total, total, "Succeeded", 0, 0)
    ended = _ended_at(steps)
    step = steps[ended - 1]
    outcome = "Canceled" if status == BatchStatus.CANCELED else "Failed"
    if lost:
        outcome += " (worker lost)"
    label = f"{outcome}: {labels.get(step.name, step.name)}"
    if step.check_failures:
        label += f" (check {', '.join(_check_names(step))})"
    if report is not None and report[0].step == ended and report[1] == step.run_id and report[0].counted:
        return Progress(ended, total, label, report[0].done, report[0].of)
    return Progress(ended, total, label, 0, 0)


def _check_names(step: _Step) -> list[str]:
    """The failed checks' names, from their step keys (``<asset>_<check>``)."""
    prefix = f"{step.name}_"
    return [key[len(prefix) :] if key.startswith(prefix) else key for key in step.check_failures]


def worker_lost(
    instance: DagsterInstance,
    run: DagsterRun,
    lease: Lease | None,
    ttl_s: float,
    record: RunRecord | None = None,
) -> bool:
    """Whether ``run`` looks alive in Dagster while its worker is dead: `job resume`'s takeover rule.

    The worker (for a distributed run, its orchestrator: the `job run` process or the daemon's run
    worker) renews the batch's lease; a lapsed lease of this run means it is dead. A run that never
    took the lease is dead only once it started (or was created by a CLI process, which adopts the
    lease it holds) more than a TTL ago; a queued run of the daemon's has not started and is not.
    """
    if run.status not in _MAY_BE_LIVE:
        return False
    if lease is not None and lease.is_live():  # judged on the database's clock, read with the lease
        return False
    if lease is not None and lease.run_id == run.run_id:
        return True
    record = record if record is not None else instance.get_run_record_by_id(run.run_id)
    started = record.start_time if record and record.start_time else None
    if started is None:
        # Not started: queued for the daemon, or a CLI process that died right after creating it
        # (dead once the lease it took for the run has lapsed).
        return run.remote_job_origin is None and lease is not None
    return now() - started >= ttl_s


def _lost_reason(batch_id: str, status: BatchStatus, lease: Lease | None) -> str:
    """The sentence a batch whose worker died ends with: who, since when, and what continues it."""
    holder = f"{lease.owner} " if lease is not None else ""
    if lease is not None and lease.seconds_left() > 0 and holder_is_gone(lease.owner):
        how = f"process {owner_pid(lease.owner)} no longer exists on this host"
    else:
        how = "its lease lapsed" + (f" {-lease.seconds_left():.0f} s ago" if lease is not None else "")
    what = "canceled after its" if status == BatchStatus.CANCELED else "its"
    return f"{what} worker {holder}was lost ({how}); continue with `job resume --id {batch_id}`"


def _live_progress(
    steps: list[_Step], report: tuple[Progress, str] | None, newest_run_id: str, labels: Mapping[str, str]
) -> Progress | None:
    """The step running now (of the newest run), with its report's count when the report is its own.

    A report left by an earlier step or an earlier run is never shown as the running step's: a
    resume shows nothing until its first step starts, a step that reported no count shows none.
    """
    running = [
        (n, st)
        for n, st in enumerate(steps, 1)
        if st.status == StepStatus.IN_PROGRESS and st.run_id == newest_run_id
    ]
    if not running:
        if report is not None and report[1] == newest_run_id:
            return report[0]  # between two steps of this run: the last report of the one that just ended
        return None
    n, step = running[-1]
    if report is not None and report[0].step == n and report[1] == step.run_id:
        return report[0]
    return Progress(n, len(steps), labels.get(step.name, step.name), 0, 0)


def step_metadata(instance: DagsterInstance, runs: Sequence[DagsterRun]) -> dict[str, dict[str, Any]]:
    """Each step's latest materialization metadata across the lineage, as plain values, in step order."""
    return {name: step.metadata for name, step in _fold_steps(instance, runs).items()}


def step_states(instance: DagsterInstance, runs: Sequence[DagsterRun]) -> dict[str, StepStatus]:
    """Each step's status across the lineage (the same fold ``job status`` shows)."""
    return {name: step.status for name, step in _fold_steps(instance, runs).items()}


def steps_to_run(instance: DagsterInstance, runs: Sequence[DagsterRun]) -> list[str]:
    """The steps a re-execution from failure of the lineage runs: every one not completed."""
    return [name for name, state in step_states(instance, runs).items() if state != StepStatus.COMPLETED]


def is_auto_resume(run: DagsterRun) -> bool:
    """Started by the daemon's automatic resume (a run retry of one inherits its tags, not its parent)."""
    return bool(run.parent_run_id) and run.tags.get(AUTO_RESUME_OF_TAG) == run.parent_run_id


def auto_resume_summary(runs: Sequence[DagsterRun]) -> AutoResumeModel | None:
    """The daemon's automatic resumes of the lineage (``durable_assets.ops.auto_resume``), or None."""
    own = [r for r in runs if is_auto_resume(r)]
    if not own:
        return None
    last = own[-1].tags
    return AutoResumeModel(
        attempts=int(last.get(AUTO_RESUME_ATTEMPT_TAG, len(own))),
        max_attempts=int(last.get(AUTO_RESUME_MAX_TAG, 0)),
        run_ids=[r.run_id for r in own],
    )


def _provider(db: DurableDatabase, batch_id: str) -> ProviderModel | None:
    bound = AccountBindings(db).get(batch_id)
    return (
        None
        if bound is None
        else ProviderModel(kind=bound.kind, account=bound.account, livemode=bound.livemode)
    )


def _decisions(db: DurableDatabase, job: str, batch_id: str) -> list[DecisionModel]:
    """The decisions the batch's job honours for its items, at the account it is bound to (none
    for a batch not yet bound: a decision belongs to an account)."""
    bound = AccountBindings(db).get(batch_id)
    namespace = bound.namespace if bound is not None else DEFAULT_NAMESPACE
    found = sorted(ItemDecisions(db, namespace).of_job(job).values(), key=lambda d: d.item)
    return [
        DecisionModel(
            item=d.item,
            decision=d.decision,
            note=d.note,
            decided_at=d.as_json()["decided_at"],
            decided_by=d.decided_by,
        )
        for d in found
    ]


@dataclass(frozen=True)
class LostWorkerEnd:
    """How a batch whose worker died ends: ``status`` failed (canceled if a cancel was asked),
    ``reason`` naming the lost worker and the `job resume` that continues it, in run ``run_id``."""

    status: BatchStatus
    reason: str
    run_id: str


def lost_worker_end(instance: DagsterInstance, batch_id: str) -> LostWorkerEnd | None:
    """The end of a batch whose worker died, or None while its worker may be alive: what
    :func:`batch_status` derives, read for a live stream, which has no Dagster event to end on
    (the dead run stays STARTED until `job resume`)."""
    runs = batch_runs(instance, batch_id)
    if not runs:
        return None
    db = DurableDatabase.for_instance(instance)
    lease = LeaseStore(db).get(batch_id)
    if not worker_lost(instance, runs[-1], lease, lease_ttl_s()):
        return None
    status = BatchStatus.CANCELED if CancelStore(db).is_requested(batch_id) else BatchStatus.FAILED
    return LostWorkerEnd(status, _lost_reason(batch_id, status, lease), runs[-1].run_id)


def batch_status(instance: DagsterInstance, batch_id: str, *, include_steps: bool = True) -> BatchStatusModel:
    """The status of docs/contract.md, typed: what the CLI, the API, webhooks and the summary read.

    A :class:`BatchStatusModel`, the model ``/openapi.json`` is generated from: a value outside
    what the document promises fails here, not in a client. It becomes JSON only at the edges
    (``job status --json``, the HTTP API, a webhook's ``data``, a prune archive) through
    :meth:`BatchStatusModel.as_json`, so every reader in between names fields, not string keys.
    """
    check_batch_id(batch_id)
    return _batch_status(instance, batch_id, lineage_records(instance, [batch_id])[batch_id], include_steps)


def _batch_status(
    instance: DagsterInstance, batch_id: str, records: Sequence[RunRecord], include_steps: bool
) -> BatchStatusModel:
    """:func:`batch_status` of the lineage ``records`` (oldest first), read already."""
    if not records:
        raise UnknownBatchError(f"no batch {batch_id!r} in this instance ({instance.root_directory})")
    runs = [r.dagster_run for r in records]
    db = DurableDatabase.for_instance(instance)
    status = BatchStatus.of_run(runs[-1].status)
    if status == BatchStatus.RUNNING and CancelStore(db).is_requested(batch_id):
        status = BatchStatus.CANCELING
    # A run Dagster still calls running whose worker is dead has ended: derived here, never written
    # (status is read-only; `job resume` records the dead run's failure when it takes over).
    lease = LeaseStore(db).get(batch_id)
    lost = worker_lost(instance, runs[-1], lease, lease_ttl_s(), records[-1])
    if lost:
        status = BatchStatus.CANCELED if status == BatchStatus.CANCELING else BatchStatus.FAILED
    # `job cancel` of a lost worker's batch records the run canceled (runner.cancel_batch); it
    # still reads as a lost worker's end, with the step it stopped at and the resume advice.
    lost = lost or (
        status == BatchStatus.CANCELED and runs[-1].tags.get(WORKER_LOST_TAG) == WORKER_LOST_CANCELED
    )
    # Progress before steps: an older report with newer step states can only undercount the running
    # step, so percent_complete never goes backwards between two polls (the other order could pair a
    # finished step's report with a snapshot taken before it finished, and drop a step's worth).
    report = ProgressStore(db).latest_of_run(batch_id)
    job = job_shape(instance, runs)  # from the runs' snapshots: no code location to import
    labels = job.labels
    folded = _fold_steps(instance, runs, job)
    steps = list(folded.values())
    if lost:
        _end_lost_run(steps, runs[-1].run_id, status, _lost_reason(batch_id, status, lease))
    completed = sum(1 for st in steps if st.status == StepStatus.COMPLETED)
    if status.terminal:
        progress: Progress | None = _final_progress(status, steps, report, labels, lost)
    else:
        progress = _live_progress(steps, report, runs[-1].run_id, labels)
    fraction = 0.0
    # Only the running step's own count adds a fraction (between steps the report is a finished one's).
    if progress is not None and status in (BatchStatus.RUNNING, BatchStatus.CANCELING) and progress.counted:
        index = progress.step - 1
        in_progress = 0 <= index < len(steps) and steps[index].status == StepStatus.IN_PROGRESS
        fraction = min(progress.done / progress.of, 1.0) if in_progress else 0.0
    percent = (
        100.0
        if status == BatchStatus.SUCCEEDED
        else min(round(100.0 * (completed + fraction) / len(steps), 1), NOT_YET_DONE_PERCENT)
    )
    held = held_for_review([st.metadata for st in steps])
    code = code_model(db, batch_id, stored_code_versions(instance, runs[-1]))
    if code is not None and code.changed and status == BatchStatus.FAILED:
        # Where it stopped, the reason a person must act on first: no automatic resume crosses it.
        stopped = steps[_ended_at(steps) - 1]
        note = (
            f"code changed since the batch started ({', '.join(code.changed)}); `job resume --id "
            f"{batch_id}` once its code is deployed again, or with --accept-code-change"
        )
        stopped.error = note if not stopped.error else f"{note}. Before that: {stopped.error}"
    model = BatchStatusModel(
        id=batch_id,
        job=job.name,
        status=status,
        run_ids=[r.run_id for r in runs],
        percent_complete=percent,
        progress=ProgressModel.model_validate(progress, from_attributes=True) if progress else None,
        needs_review=held > 0,
        held_for_review=held,
        auto_resume=auto_resume_summary(runs),
        created_at=_iso(records[0].create_timestamp.timestamp()),
        updated_at=_iso(records[-1].update_timestamp.timestamp()),
        provider=_provider(db, batch_id),
        guardrails=guardrails_model(db, batch_id, job.guardrail_variables),
        code=code,
        files=[
            BatchFileModel(name=f.name, label=f.label, step=f.step, uri=f.uri)
            for f in batch_files({name: st.metadata for name, st in folded.items()}, job.files)
        ],
        steps=[st.model(n) for n, st in enumerate(steps, start=1)] if include_steps else None,
        decisions=_decisions(db, job.name, batch_id) if include_steps else None,
    )
    return model


def _end_lost_run(steps: list[_Step], run_id: str, status: BatchStatus, reason: str) -> None:
    """The dead run's steps as its end leaves them: the running one failed (or skipped, when the
    batch was being canceled), and the reason on the step it stopped at."""
    for step in steps:
        if step.status == StepStatus.IN_PROGRESS and step.run_id == run_id:
            step.status = StepStatus.SKIPPED if status == BatchStatus.CANCELED else StepStatus.FAILED
    # Died between two steps, the step is the next one (still pending): where `job resume` goes on.
    steps[_ended_at(steps) - 1].error = reason


#: ``job list`` and ``GET /runs`` show this many batches unless told otherwise.
LIST_DEFAULT_LIMIT = 50
#: Runs read per query while a page of batches is gathered (a batch has one run, or a few).
_RUNS_PER_READ = 200


@dataclass(frozen=True)
class BatchPage:
    """One page of ``job list``: the batches, and what follows them."""

    batches: list[BatchStatusModel]
    #: Whether older batches follow this page (``before=`` the last one reads them).
    has_more: bool
    #: How many batches follow, where one query tells (every job, first page); None otherwise.
    more: int | None


def list_batches(
    instance: DagsterInstance,
    *,
    job: str | None = None,
    limit: int | None = LIST_DEFAULT_LIMIT,
    before: str | None = None,
) -> BatchPage:
    """A page of batches (of durable job ``job``, or of all), newest first (by its newest run):
    at most ``limit`` (None: all) of those older than batch ``before``.

    Read newest run first, a few hundred runs per query, until the page is full, so its cost
    follows the page, not the instance's history (a year of nightly batches listed in full cost
    ~40 ms each: the status of every one). A batch's steps come from its runs' stored snapshots
    (``job_shape``), so listing loads no code location; a batch whose runs were recorded without
    their steps is shown only if this location registers its job.
    """
    runs_of = RunsFilter(job_name=job) if job else None
    seen: set[str] = set()
    cursor: str | None = None
    if before is not None:
        newest = instance.get_run_records(RunsFilter(tags={BATCH_TAG: before}), limit=1)
        if not newest:
            raise UnknownBatchError(f"no batch {before!r} in this instance ({instance.root_directory})")
        cursor = newest[0].dagster_run.run_id
        seen.add(before)
    found: list[str] = []
    has_more = False
    while not has_more:
        records = instance.get_run_records(runs_of, limit=_RUNS_PER_READ, cursor=cursor)
        for record in records:
            run = record.dagster_run
            bid = run.tags.get(BATCH_TAG)
            if not bid or bid in seen:
                continue
            seen.add(bid)
            # Below ``before``'s newest run, a batch may still have a newer run: it was on a page before.
            if cursor is not None and before is not None and not _is_newest_run(instance, bid, run.run_id):
                continue
            if not _shape_known(instance, run):
                continue
            if limit is not None and len(found) == limit:
                has_more = True
                break
            found.append(bid)
        if len(records) < _RUNS_PER_READ:
            break
        cursor = records[-1].dagster_run.run_id
    more = None
    if has_more and job is None and before is None:
        batches_in_instance = sum(len(ids) for _key, ids in instance.get_run_tags(tag_keys=[BATCH_TAG]))
        more = max(batches_in_instance - len(found), 1)
    lineages = lineage_records(instance, found)
    skip_shard_checks(instance, [r.dagster_run.run_id for records in lineages.values() for r in records])
    return BatchPage(
        [_batch_status(instance, b, lineages[b], include_steps=False) for b in found],
        has_more,
        more if has_more else 0,
    )


def _is_newest_run(instance: DagsterInstance, batch_id: str, run_id: str) -> bool:
    newest = instance.get_run_records(RunsFilter(tags={BATCH_TAG: batch_id}), limit=1)
    return bool(newest) and newest[0].dagster_run.run_id == run_id


def _shape_known(instance: DagsterInstance, run: DagsterRun) -> bool:
    """Whether a status of ``run``'s batch can name its steps: its snapshot carries them, or this
    code location registers its job (loaded only for a run recorded without them)."""
    if stored_steps(instance, run):
        return True
    from durable_assets.ops.registry import durable_jobs

    return durable_jobs().owning(run.job_name) is not None
