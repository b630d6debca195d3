"""What a batch's event stream carries: ``progress``, ``step`` and ``status`` events.

Every event is read from the batch's Dagster event logs (ops/runlog.py): step and run status
changes are Dagster's own events and progress reports are engine events the durable steps write
there (kit/progress.py). One source in one id sequence is what makes the ids increase, the
interleaving true, and a resume with ``Last-Event-ID`` exact: the same storage always yields the
same events with the same ids, whichever server process reads it.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

from dagster import DagsterEventType, DagsterInstance

from durable_assets.errors import UnknownBatchError
from durable_assets.kit.runtime import Progress, progress_from_event
from durable_assets.ops.registry import durable_jobs
from durable_assets.ops.runlog import LineageFeed, LineageRecord, encode_id, run_end_id
from durable_assets.ops.sse import ServerSentEvent
from durable_assets.ops.status import batch_runs, check_batch_id, lost_worker_end
from durable_assets.ops.status_model import BatchStatus, StepEventStatus

STEP_EVENT_STATUS = {
    DagsterEventType.STEP_START: StepEventStatus.IN_PROGRESS,
    DagsterEventType.STEP_RESTARTED: StepEventStatus.IN_PROGRESS,
    DagsterEventType.STEP_SUCCESS: StepEventStatus.COMPLETED,
    DagsterEventType.STEP_FAILURE: StepEventStatus.FAILED,
    DagsterEventType.STEP_UP_FOR_RETRY: StepEventStatus.RETRYING,
    DagsterEventType.STEP_SKIPPED: StepEventStatus.SKIPPED,
}
#: Run events that change the batch's status (the names of ``job status``). Starting and dequeued
#: are left out: they would repeat "running" and "queued".
RUN_EVENT_STATUS = {
    DagsterEventType.RUN_ENQUEUED: BatchStatus.QUEUED,
    DagsterEventType.RUN_START: BatchStatus.RUNNING,
    DagsterEventType.RUN_CANCELING: BatchStatus.CANCELING,
    DagsterEventType.RUN_SUCCESS: BatchStatus.SUCCEEDED,
    DagsterEventType.RUN_FAILURE: BatchStatus.FAILED,
    DagsterEventType.RUN_CANCELED: BatchStatus.CANCELED,
}
EVENT_TYPES = {*STEP_EVENT_STATUS, *RUN_EVENT_STATUS, DagsterEventType.ENGINE_EVENT}


def _iso(ts: float) -> str:
    return datetime.fromtimestamp(ts, tz=UTC).isoformat().replace("+00:00", "Z")


def _step_keys(job_name: str) -> tuple[str, ...]:
    jobs = durable_jobs()
    return (jobs.owning(job_name) or jobs.default).step_keys


def to_server_sent_event(batch_id: str, item: LineageRecord) -> ServerSentEvent | None:
    """The stream's event for one event-log record, or None for records the stream does not show."""
    entry = item.record.event_log_entry
    event = entry.dagster_event
    if event is None:
        return None
    base: dict[str, Any] = {"run_id": item.run.run_id, "timestamp": _iso(entry.timestamp)}
    kind = event.event_type
    if kind in RUN_EVENT_STATUS:
        return ServerSentEvent(
            item.event_id, "status", {"id": batch_id, "status": RUN_EVENT_STATUS[kind], **base}
        )
    steps = _step_keys(item.run.job_name)
    if kind in STEP_EVENT_STATUS and event.step_key in steps:
        data = {
            "step": steps.index(event.step_key) + 1,
            "step_name": event.step_key,
            "status": STEP_EVENT_STATUS[kind],
            **base,
        }
        return ServerSentEvent(item.event_id, "step", data)
    progress = progress_from_event(event)
    if progress is not None:
        return ServerSentEvent(item.event_id, "progress", {**progress.as_dict(), **base})
    return None


#: How often a quiet stream asks whether its batch's worker died (a lease read and a run read).
LOST_WORKER_CHECK_S = 2.0


class BatchEventFeed:
    """One client's position in one batch's events.

    A batch whose worker died has no event to end on: Dagster keeps the run STARTED until `job
    resume` takes it over. While the stream is quiet it therefore asks, every
    :data:`LOST_WORKER_CHECK_S`, what `job status` asks; a lost worker ends the stream with the
    terminal ``status`` event `job status` shows (failed, or canceled, with the reason and the
    `job resume` advice), as the contract's "ends after a terminal status" promises.

    That event has no record in the event log, so its id is derived from what it describes: the
    last id of the dead run's range (:func:`~durable_assets.ops.runlog.run_end_id`). Every poll of
    every server computes the same id for it, so a client that reconnects with it as
    ``Last-Event-ID`` gets a 204 (:meth:`nothing_left`) instead of a new event with a higher id
    each time (issue #34: an EventSource then never closed). A `job resume` starts a new run,
    whose ids are all above it: a client reconnecting after the resume continues with its events.
    """

    def __init__(self, instance: DagsterInstance, batch_id: str, after: int | None = None) -> None:
        check_batch_id(batch_id)
        if not batch_runs(instance, batch_id):
            raise UnknownBatchError(f"no batch {batch_id!r} in this instance")
        self.instance = instance
        self.batch_id = batch_id
        self.resumed = after is not None
        self._after = after or 0
        self._feed = LineageFeed(
            instance, lambda: batch_runs(instance, batch_id), EVENT_TYPES, after=after or 0
        )
        self._last_lost_check = time.monotonic()

    def poll(self) -> tuple[Sequence[ServerSentEvent], bool]:
        records, ended = self._feed.poll()
        events = [e for e in (to_server_sent_event(self.batch_id, r) for r in records) if e is not None]
        if ended or records or not self._feed.settled:
            return events, ended
        if time.monotonic() - self._last_lost_check < LOST_WORKER_CHECK_S:
            return events, False
        self._last_lost_check = time.monotonic()
        lost = lost_worker_end(self.instance, self.batch_id)
        if lost is None:
            return events, False
        end_id = self._lost_end_id(lost.run_id)
        if end_id is None:  # a resume has just started a new run: its events follow
            return events, False
        if end_id <= self._feed.cursor:  # this client already has it: end without repeating it
            return events, True
        data = {
            "id": self.batch_id,
            "status": lost.status,
            "error": lost.reason,
            "run_id": lost.run_id,
            "timestamp": _iso(time.time()),
        }
        return [ServerSentEvent(end_id, "status", data)], True

    def _lost_end_id(self, run_id: str) -> int | None:
        """The id of the lost-worker end of run ``run_id``, if it is still the newest run."""
        runs = batch_runs(self.instance, self.batch_id)
        if not runs or runs[-1].run_id != run_id:
            return None
        return run_end_id(len(runs) - 1)

    def nothing_left(self) -> bool:
        """A resumed client already has every event of a batch that has ended: its newest run has
        finished and nothing follows the cursor, or its worker was lost and the client has the
        terminal event that says so (its id, or a later one)."""
        if not self.resumed:
            return False
        if self._feed.ended_at_cursor():
            return True
        runs = batch_runs(self.instance, self.batch_id)
        if not runs or self._after < run_end_id(len(runs) - 1):
            return False
        lost = lost_worker_end(self.instance, self.batch_id)
        return lost is not None and lost.run_id == runs[-1].run_id


class ProgressFollower:
    """Every progress report of the runs a batch gets from now on, in order: what `job run` and
    `job resume` print while they work.

    Read from the event log, as the stream is, not by polling the status: a poll shows the step
    running at that instant, and a step shorter than the interval was never printed (2 -> 4). Every
    durable step reports its start, so every step it passes through is printed. Runs that exist
    when the follower is made are left out: a resume shows its own run, not the end of the last.
    """

    def __init__(self, instance: DagsterInstance, batch_id: str) -> None:
        self._feed = LineageFeed(
            instance,
            lambda: batch_runs(instance, batch_id),
            {DagsterEventType.ENGINE_EVENT},
            after=encode_id(len(batch_runs(instance, batch_id)), 0),
        )

    def poll(self) -> list[Progress]:
        """The reports settled since the last poll (the feed holds a record back for one poll)."""
        records, _ended = self._feed.poll()
        found = (progress_from_event(r.record.event_log_entry.dagster_event) for r in records)
        return [p for p in found if p is not None]
