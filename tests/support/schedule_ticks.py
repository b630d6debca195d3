"""A schedule tick the way Dagster's daemon runs it, including the daemon dying in the middle.

Both schedules (the daily refunds, the nightly credits) promise one batch per day however often
their tick is evaluated. The hard case is the daemon's own: it launches the run and dies before
recording the tick, then evaluates the same tick again. This drives Dagster's scheduler loop
(``launch_scheduled_runs``, with its debug crash flag) against our code location, so the tests
assert on what the real daemon would leave behind.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import datetime, timedelta

from dagster import DagsterInstance, DagsterRun, DagsterRunStatus, RunsFilter
from dagster._core.scheduler.instigation import InstigatorTick, TickStatus
from dagster._core.test_utils import create_test_daemon_workspace_context, freeze_time, load_remote_repo
from dagster._core.workspace.load_target import ModuleTarget
from dagster._scheduler.scheduler import launch_scheduled_runs

from durable_assets.kit.tags import BATCH_TAG
from tests.support.processes import REPO


class SimulatedDaemonCrash(Exception):
    pass


@dataclass(frozen=True)
class TickStory:
    """What the instance holds after a crashed tick and two re-evaluations of it."""

    #: The tick the daemon died in: failed, with no run recorded on it.
    interrupted: InstigatorTick
    #: Runs of the batch right after the crash (the launch happened before the daemon died).
    runs_after_crash: int
    #: Every run the schedule launched, and the schedule's ticks, after the re-evaluations.
    runs: list[DagsterRun]
    ticks: list[InstigatorTick]

    def one_queued_run(self, batch: str) -> DagsterRun:
        """The promise: the crashed tick recorded nothing, yet the re-evaluations launched no second
        run; the one run is the day's batch, queued as in production, and the tick is done."""
        assert self.interrupted.status == TickStatus.FAILURE and not self.interrupted.run_ids
        assert self.runs_after_crash == 1
        assert len(self.runs) == 1, [r.tags for r in self.runs]
        [run] = self.runs
        assert run.tags[BATCH_TAG] == batch and run.tags["dagster/partition"] == batch
        assert run.tags["dagster/run_key"] == batch
        assert run.status == DagsterRunStatus.QUEUED  # submitted to the run queue, as in production
        assert len(self.ticks) == 1 and self.ticks[0].status in (TickStatus.SUCCESS, TickStatus.SKIPPED)
        return run


def crash_mid_tick_then_tick_again(
    instance: DagsterInstance, schedule: str, tick: datetime, batch: str
) -> TickStory:
    """Start ``schedule`` an hour before ``tick``; at ``tick`` + 30 s the daemon launches the run and
    dies, then evaluates the same tick again, and once more (which must find nothing left to do)."""
    target = ModuleTarget(
        module_name="durable_assets.definitions",
        attribute="defs",
        working_directory=str(REPO),
        location_name="durable_assets",
    )
    with create_test_daemon_workspace_context(target, instance) as context:
        remote = load_remote_repo(context, "__repository__").get_schedule(schedule)
        with freeze_time(tick - timedelta(hours=1)):
            instance.start_schedule(remote)
        at = tick + timedelta(seconds=30)

        def tick_once(crash_after_launch: bool = False) -> None:
            flags = {schedule: {"RUN_LAUNCHED": SimulatedDaemonCrash("daemon died mid-tick")}}
            list(
                launch_scheduled_runs(
                    context,
                    logging.getLogger("test-scheduler"),
                    at,
                    {},
                    max_tick_retries=1,  # a tick that failed mid-way is evaluated again, as the daemon does
                    debug_crash_flags=flags if crash_after_launch else None,  # type: ignore[arg-type]
                )
            )

        with freeze_time(at):
            tick_once(crash_after_launch=True)
            [interrupted] = instance.get_ticks(remote.get_remote_origin_id(), remote.selector_id)
            runs_after_crash = len(instance.get_runs(RunsFilter(tags={BATCH_TAG: batch})))
            tick_once()  # the daemon evaluates the same tick again
            tick_once()  # and a later iteration finds nothing left to do
        return TickStory(
            interrupted=interrupted,
            runs_after_crash=runs_after_crash,
            runs=list(instance.get_runs(RunsFilter(tags={"dagster/schedule_name": schedule}))),
            ticks=list(instance.get_ticks(remote.get_remote_origin_id(), remote.selector_id)),
        )
