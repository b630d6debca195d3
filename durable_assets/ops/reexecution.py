"""Continuing a batch from its last committed step: what every resume shares, whoever starts it.

`job resume` re-executes in its own process (it is the worker, ``runner.resume_batch``); the
daemon's automatic resume (``auto_resume``) cannot run a batch inside a sensor, so it creates the
same re-execution from failure and hands it to the run queue. Both skip the re-execution when every
step had already committed, and both tag the new run with its batch.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from dagster import (
    DagsterEvent,
    DagsterEventType,
    DagsterInstance,
    DagsterRun,
    DagsterRunStatus,
    JobDefinition,
    ReexecutionOptions,
)

from durable_assets.kit.runtime import (
    BATCH_TAG,
    PARENT_RUN_ID_TAG,
    PARTITION_TAG,
    RESUME_RETRY_TAG,
    ROOT_RUN_ID_TAG,
)
from durable_assets.ops.status import step_states
from durable_assets.ops.status_model import StepStatus

#: Run statuses whose worker may still be alive (or not started yet).
LIVE = frozenset(
    {
        DagsterRunStatus.QUEUED,
        DagsterRunStatus.NOT_STARTED,
        DagsterRunStatus.STARTING,
        DagsterRunStatus.STARTED,
        DagsterRunStatus.CANCELING,
    }
)


def batch_tags(batch_id: str) -> dict[str, str]:
    return {BATCH_TAG: batch_id, PARTITION_TAG: batch_id}


def all_steps_committed(instance: DagsterInstance, runs: Sequence[DagsterRun]) -> bool:
    return all(state == StepStatus.COMPLETED for state in step_states(instance, runs).values())


def record_run_success(instance: DagsterInstance, run: DagsterRun, batch_id: str, by: str) -> None:
    """Append the RUN_SUCCESS event the dead worker could not write; the UI and status then agree."""
    event = DagsterEvent(
        event_type_value=DagsterEventType.RUN_SUCCESS.value,
        job_name=run.job_name,
        message=(
            f"durable-assets: every step of batch {batch_id!r} had committed when its worker died; "
            f"{by} recorded the run's success instead of re-executing nothing."
        ),
    )
    instance.report_dagster_event(event, run_id=run.run_id)


def steps_from_failure(
    instance: DagsterInstance, job: Any, parent: DagsterRun
) -> tuple[list[str], Any, bool]:
    """The steps a re-execution from failure of ``parent`` runs in ``job`` as the code defines it now,
    the known state to plan them with, and whether the job changed since ``parent`` was planned.

    Dagster takes the parent's failed and unfinished steps by key. After an upgrade the job may no
    longer have some of them (a check moved to another asset, under a new key), and Dagster then
    refuses the whole plan: a batch the last release left failed could never resume. A key the job no
    longer has is dropped; a step the whole job gained, which never ran for this batch, runs now (its
    inputs are the committed outputs of the parent lineage or of steps re-executed with it).
    """
    from durable_assets.kit.runtime import KnownExecutionState, create_execution_plan

    step_keys, known_state = KnownExecutionState.build_resume_retry_reexecution(instance, parent_run=parent)
    snapshot = instance.get_execution_plan_snapshot(parent.execution_plan_snapshot_id)  # type: ignore[arg-type]
    before = {step.key for step in snapshot.steps}
    now = create_execution_plan(job, parent.run_config, tags=parent.tags).step_keys_to_execute
    if set(step_keys) <= set(now) and set(now) <= before:
        return list(step_keys), known_state, False  # the job is as the parent ran it
    kept = [key for key in step_keys if key in now]
    subset = parent.asset_selection or parent.asset_check_selection  # a selection gains nothing new
    gained = [] if subset else [key for key in now if key not in before]
    return kept + gained, known_state, True


def from_failure(instance: DagsterInstance, job: Any, parent: DagsterRun) -> ReexecutionOptions:
    """``ReexecutionOptions.from_failure``, for the job as it is now (see :func:`steps_from_failure`)."""
    keys, _known, changed = steps_from_failure(instance, job, parent)
    if not changed:
        return ReexecutionOptions.from_failure(parent.run_id, instance)
    return ReexecutionOptions(parent_run_id=parent.run_id, step_selection=keys)


def create_from_failure_run(
    instance: DagsterInstance,
    job: JobDefinition,
    parent: DagsterRun,
    *,
    run_id: str,
    tags: Mapping[str, str],
) -> DagsterRun:
    """A NOT_STARTED re-execution from failure of ``parent``, ready for ``instance.submit_run``.

    What ``execute_job(reexecution_options=ReexecutionOptions.from_failure(...))`` creates before it
    executes in-process, and what Dagster's run retries create through a code location: the failed
    and unfinished steps only (committed ones are loaded from storage), the parent's config, and the
    parent's code origins so that the run queue launches it where the parent ran. Raises
    ``ValueError`` when there is nothing to re-execute.
    """
    # Internal, as in Dagster's own run-retry path: the public API executes instead of creating.
    from durable_assets.kit.runtime import create_execution_plan

    if parent.remote_job_origin is None or parent.job_code_origin is None:
        raise ValueError(f"run {parent.run_id} was not launched from a code location; use `job resume`")
    step_keys, known_state, _changed = steps_from_failure(instance, job, parent)
    if not step_keys:
        raise ValueError(f"run {parent.run_id} has no step left to re-execute")
    if parent.asset_selection:
        job = job.get_subset(asset_selection=parent.asset_selection)
    plan = create_execution_plan(
        job, parent.run_config, step_keys_to_execute=step_keys, known_state=known_state, tags=parent.tags
    )
    root = parent.root_run_id or parent.run_id
    return instance.create_run_for_job(
        job_def=job,
        execution_plan=plan,
        run_id=run_id,
        run_config=parent.run_config,
        status=DagsterRunStatus.NOT_STARTED,
        tags={**tags, PARENT_RUN_ID_TAG: parent.run_id, ROOT_RUN_ID_TAG: root, RESUME_RETRY_TAG: "true"},
        root_run_id=root,
        parent_run_id=parent.run_id,
        asset_selection=parent.asset_selection,
        op_selection=parent.op_selection,
        resolved_op_selection=parent.resolved_op_selection,
        remote_job_origin=parent.remote_job_origin,
        job_code_origin=parent.job_code_origin,
    )
