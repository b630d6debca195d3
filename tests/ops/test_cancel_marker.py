"""A step stopped by a cancel is recognised by typed metadata, not by its error's text (issue #22).

The kit writes ``CANCELED_KEY`` on the failure of a step it stops on a cancel; the status reads it
and shows the step as skipped. Failures recorded before the marker existed carry only the text
``BatchCanceledError``, and batches still in storage must keep showing those steps as skipped.
The real-process path (a cancel during a run, the marker in the event log) is in
tests/ops/test_progress_honesty.py; for a sharded step of a distributed run, in
tests/distributed/test_worker_loss.py (``test_cancel_reaches_the_tasks``).
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from dagster import DagsterEventType, DagsterRunStatus, MetadataValue
from dagster._core.execution.plan.objects import StepFailureData, UserFailureData

from durable_assets.errors import BatchCanceledError, FencedOutError
from durable_assets.kit.steps import step_failure
from durable_assets.kit.tags import CANCELED_KEY
from durable_assets.ops.job_shape import JobShape
from durable_assets.ops.status import _fold_shard_event, _fold_steps, _Step, _stopped_by_cancel
from durable_assets.ops.status_model import StepStatus


def _failure_event(description: str, metadata: dict[str, Any] | None = None) -> Any:
    """A STEP_FAILURE event as the status fold reads it (``event_specific_data`` is Dagster's own)."""
    user = UserFailureData(label="intentional-failure", description=description, metadata=metadata or {})
    data = StepFailureData(error=None, user_failure_data=user)
    return SimpleNamespace(
        event_type=DagsterEventType.STEP_FAILURE, event_specific_data=data, step_failure_data=data
    )


def _canceled_shard() -> Any:
    return _failure_event(
        "BatchCanceledError: batch 'b' was canceled", {CANCELED_KEY: MetadataValue.bool(True)}
    )


_START = SimpleNamespace(event_type=DagsterEventType.STEP_START)


def test_the_kit_marks_a_cancel_and_nothing_else() -> None:
    canceled = step_failure(BatchCanceledError("batch 'b' was canceled"))
    assert canceled.metadata[CANCELED_KEY] == MetadataValue.bool(True)
    assert canceled.description == "BatchCanceledError: batch 'b' was canceled"  # what the UI shows
    fenced = step_failure(FencedOutError("a newer run took over"))
    assert CANCELED_KEY not in fenced.metadata
    assert fenced.description == "FencedOutError: a newer run took over"


def test_the_status_reads_the_marker_whatever_the_text() -> None:
    assert _stopped_by_cancel(_failure_event("stopped", {CANCELED_KEY: MetadataValue.bool(True)}))
    assert not _stopped_by_cancel(_failure_event("stopped", {CANCELED_KEY: MetadataValue.bool(False)}))
    assert not _stopped_by_cancel(_failure_event("ProviderRejectedError: card declined"))


def test_a_failure_recorded_before_the_marker_still_reads_as_canceled() -> None:
    assert _stopped_by_cancel(_failure_event("BatchCanceledError: the run was asked to stop"))


def test_a_canceled_shard_leaves_its_step_skipped_with_the_steps_reason() -> None:
    """As an unsharded step stopped by a cancel: skipped, and why, with no shard's name in it."""
    step = _Step("provider_customers")
    _fold_shard_event(step, _START, 1.0, "r1")
    _fold_shard_event(step, _START, 1.1, "r1")  # a second shard of the same run: one execution
    _fold_shard_event(step, _canceled_shard(), 2.0, "r1")
    assert (step.status, step.executions, step.finished_at) == (StepStatus.SKIPPED, 1, 2.0)
    assert step.reason == "BatchCanceledError: batch 'b' was canceled"
    assert "shard" not in step.model(3).model_dump_json()


def test_a_failed_shard_is_not_hidden_by_a_sibling_canceled_after_it() -> None:
    step = _Step("provider_customers")
    _fold_shard_event(step, _START, 1.0, "r1")
    _fold_shard_event(step, _failure_event("ProviderRejectedError: no"), 2.0, "r1")
    _fold_shard_event(step, _canceled_shard(), 2.1, "r1")
    _fold_shard_event(step, _START, 2.2, "r1")  # a sibling started late: the merge cannot run now
    assert (step.status, step.reason, step.executions) == (StepStatus.FAILED, "ProviderRejectedError: no", 1)


def test_a_shard_canceled_then_failed_leaves_its_step_failed() -> None:
    step = _Step("provider_customers")
    _fold_shard_event(step, _START, 1.0, "r1")
    _fold_shard_event(step, _canceled_shard(), 2.0, "r1")
    _fold_shard_event(step, _failure_event("ProviderRejectedError: no"), 2.1, "r1")
    assert (step.status, step.reason) == (StepStatus.FAILED, "ProviderRejectedError: no")


def test_the_resumes_first_shard_reopens_the_step() -> None:
    step = _Step("provider_customers")
    _fold_shard_event(step, _START, 1.0, "r1")
    _fold_shard_event(step, _canceled_shard(), 2.0, "r1")
    _fold_shard_event(step, _START, 3.0, "r2")
    assert (step.status, step.reason, step.executions, step.run_id) == (
        StepStatus.IN_PROGRESS,
        None,
        2,
        "r2",
    )


class _Log:
    """An instance's event log as the status fold reads it: ``all_logs(run_id, of_type=...)``."""

    def __init__(self, events: dict[str, list[tuple[str, Any]]]) -> None:
        self.events = events

    def all_logs(self, run_id: str, of_type: Any = None) -> list[Any]:
        return [
            SimpleNamespace(timestamp=float(n), dagster_event=SimpleNamespace(step_key=key, **vars(event)))
            for n, (key, event) in enumerate(self.events[run_id])
        ]


def test_a_sharded_step_started_once_counts_one_execution() -> None:
    """Its shards start it and its merge (the step's own key) ends it: one execution per run, as
    `executions` counts for any step (it read 2 for every sharded step that succeeded)."""
    step, shard = "provider_customers", "provider_customers__shard_{}_of_2"
    success = SimpleNamespace(event_type=DagsterEventType.STEP_SUCCESS)
    shape = JobShape("credit_migration", (step,), {}, {}, (), {})
    one_run = [(shard.format(0), _START), (shard.format(1), _START)]
    one_run += [(shard.format(0), success), (shard.format(1), success), (step, _START), (step, success)]
    runs = [SimpleNamespace(run_id="r1", status=DagsterRunStatus.SUCCESS)]
    folded = _fold_steps(_Log({"r1": one_run}), runs, shape)[step]  # type: ignore[arg-type]
    assert (folded.status, folded.executions, folded.started_at) == (StepStatus.COMPLETED, 1, 0.0)

    # Canceled in its first run, finished by a resume that runs its shards again: two.
    canceled = [(shard.format(0), _START), (shard.format(1), _START), (shard.format(0), _canceled_shard())]
    runs = [
        SimpleNamespace(run_id="r1", status=DagsterRunStatus.CANCELED),
        SimpleNamespace(run_id="r2", status=DagsterRunStatus.SUCCESS),
    ]
    folded = _fold_steps(_Log({"r1": canceled, "r2": one_run}), runs, shape)[step]  # type: ignore[arg-type]
    assert (folded.status, folded.executions, folded.reason) == (StepStatus.COMPLETED, 2, None)
