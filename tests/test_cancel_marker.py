"""A step stopped by a cancel is recognised by typed metadata, not by its error's text (issue #22).

The kit writes ``CANCELED_KEY`` on the failure of a step it stops on a cancel; the status reads it
and shows the step as skipped. Failures recorded before the marker existed carry only the text
``BatchCanceledError``, and batches still in storage must keep showing those steps as skipped.
The real-process path (a cancel during a run, the marker in the event log) is in
tests/test_progress_honesty.py.
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from dagster import MetadataValue
from dagster._core.execution.plan.objects import StepFailureData, UserFailureData

from durable_assets.errors import BatchCanceledError, FencedOutError
from durable_assets.kit.steps import step_failure
from durable_assets.kit.tags import CANCELED_KEY
from durable_assets.ops.status import _stopped_by_cancel


def _failure_event(description: str, metadata: dict[str, Any] | None = None) -> Any:
    """A STEP_FAILURE event as the status fold reads it (``event_specific_data`` is Dagster's own)."""
    user = UserFailureData(label="intentional-failure", description=description, metadata=metadata or {})
    return SimpleNamespace(event_specific_data=StepFailureData(error=None, user_failure_data=user))


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
