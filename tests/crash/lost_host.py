"""The story both daemon tests tell after a host dies: what Dagster does, then what our sensor does.

A worker and its code server are SIGKILLed together. Run monitoring fails the run from the lease;
Dagster's run retry cannot reach the code location and drops the retry; nothing restarts until the
code server is back; then the auto-resume sensor re-executes the batch from failure and it succeeds.
The refund job (tests/crash/test_auto_resume.py) and a user's own job
(tests/crash/test_user_job_auto_resume.py) assert the same story, so it is told once, here.
Under `job serve-location` (tests/crash/test_serve_location.py) the code server is back before the
run is failed, and the story goes from there to the sensor's resume (:meth:`LostHost.finish`).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

from dagster import DagsterEventType, DagsterInstance, DagsterRun, DagsterRunStatus, RunsFilter

from durable_assets.kit.leases import Lease, owner_pid
from durable_assets.kit.tags import BATCH_TAG, WORKER_LOST_TAG
from tests.support.dagster_dev import CodeServer, DagsterDev, LaunchedJob, SupervisedCodeServer
from tests.support.polling import wait_until

from .helpers import InstanceReader, job_env

WILL_RETRY_TAG = "dagster/will_retry"


def diagnose(instance: DagsterInstance, run_id: str) -> str:
    """What the run's tags and engine events say, for a failure message."""
    run = instance.get_run_by_id(run_id)
    events = instance.all_logs(run_id, of_type={DagsterEventType.ENGINE_EVENT, DagsterEventType.RUN_FAILURE})
    lines = [f"run {run_id}: {run.status if run else None} tags={dict(run.tags) if run else None}"]
    for e in events:
        kind = e.dagster_event.event_type_value if e.dagster_event else ""
        lines.append(f"  {kind}: {e.message[:300]}")
    return "\n".join(lines)


def parent_pid(pid: int) -> int:
    stat = Path(f"/proc/{pid}/stat").read_text()
    return int(stat.rsplit(")", 1)[1].split()[1])


def run_of(instance: DagsterInstance, run_id: str) -> DagsterRun:
    found = instance.get_run_by_id(run_id)
    assert found is not None, f"no run {run_id}"
    return found


class Recovery(NamedTuple):
    """How the batch came back, with the seconds since the kill at each stage."""

    #: Seconds from the kill until Dagster dropped its retry, the sensor resumed, the batch succeeded.
    dropped_s: float
    resumed_s: float
    succeeded_s: float
    #: `job status --json` once the batch succeeded.
    status: dict[str, Any]
    #: The run the host took down, and the sensor's re-execution of it.
    failed: DagsterRun
    resumed: DagsterRun
    #: Every run of the batch, newest first.
    lineage: list[DagsterRun]
    lineage_story: str

    def timeline(self) -> str:
        return (
            f"retry dropped {self.dropped_s:.1f} s after the kill, automatic resume at "
            f"{self.resumed_s:.1f} s, succeeded at {self.succeeded_s:.1f} s"
        )


@dataclass
class LostHost:
    """One batch launched as the UI launches it, on a code server whose host is then lost."""

    reader: InstanceReader
    dev: DagsterDev
    code: CodeServer
    batch: str
    first_run: str = ""
    killed_at: float = 0.0

    def launch(self, partitions: str, size: int, **launch: Any) -> None:
        """Start the code server and `dagster dev`, and launch the batch (``launch``: run config
        and tags for :meth:`DagsterDev.launch`)."""
        self.code.start()
        self.dev.start()
        self.reader.instance.add_dynamic_partitions(partitions, [self.batch])
        self.first_run = self.dev.launch(self.batch, size, **launch)

    def story(self) -> str:
        """The run's tags and events and both processes' logs, for a failure message."""
        return f"{diagnose(self.reader.instance, self.first_run)}\n{self.dev.proc.tail()}\n{self.code.tail()}"

    def wait_mid_effects(self, effects_started: Callable[[], bool], what: str) -> None:
        """Until the first run's worker holds the lease and ``effects_started``; the worker must be a
        child of the code server, so that killing the host kills it."""

        def worker_mid_effects() -> Lease | None:
            run = run_of(self.reader.instance, self.first_run)
            assert not run.is_finished, f"run ended before the kill: {run}"
            lease = self.reader.lease(self.batch)
            mine = lease is not None and lease.run_id == self.first_run
            return lease if mine and effects_started() else None

        lease = wait_until(worker_mid_effects, timeout=180, interval=0.02, what=what, detail=self.story)
        assert parent_pid(owner_pid(lease.owner)) == self.code.pid, (
            "the run worker is a child of the code server"
        )

    def kill(self) -> None:
        self.code.kill_host()  # the worker and its code server, together
        self.killed_at = time.monotonic()

    def wait_failed_from_its_lease(self) -> float:
        """Until run monitoring failed the run because its lease lapsed; the seconds since the kill.
        For a run launched without Dagster's run retries (``dagster/max_retries: 0``)."""
        instance, first_run = self.reader.instance, self.first_run
        wait_until(
            lambda: (
                WORKER_LOST_TAG in run_of(instance, first_run).tags
                and run_of(instance, first_run).status == DagsterRunStatus.FAILURE
            ),
            timeout=90,
            what="run monitoring to fail the run from its lease",
            detail=self.story,
        )
        return time.monotonic() - self.killed_at

    def wait_retry_dropped(self) -> float:
        """Until run monitoring failed the run from its lease and Dagster's run retry, unable to reach
        the code location, dropped it; the seconds since the kill. Nothing has continued the batch."""
        instance, first_run = self.reader.instance, self.first_run
        wait_until(
            lambda: run_of(instance, first_run).tags.get(WILL_RETRY_TAG) == "false",
            # Dagster's daemon gives up on the unreachable location on its own schedule (gRPC
            # retries inside); on a loaded 2-core machine that took over 2 minutes once in 20.
            timeout=150,
            what="Dagster's run retry to be dropped",
            detail=self.story,
        )
        assert run_of(instance, first_run).tags.get(WORKER_LOST_TAG) == "lease_expired"
        assert not instance.get_runs(RunsFilter(tags={"dagster/parent_run_id": first_run}))
        return time.monotonic() - self.killed_at

    def recover(self, while_down: Callable[[], None] = lambda: None) -> Recovery:
        """Wait through the story in this module's docstring and return what it ended with.

        ``while_down`` asserts what must hold while the location is unreachable (e.g. nothing sent).
        """
        # Nobody restarts anything until Dagster has dropped its retry.
        dropped = self.wait_retry_dropped()
        while_down()
        self.code.start()  # the host is back: its supervisor restarts the code server, nothing else
        return self.finish(dropped)

    def finish(self, dropped_s: float) -> Recovery:
        """Once the code location is back: until the sensor resumed the batch and it succeeded.
        ``dropped_s``: the seconds from the kill to the first stage the caller waited for."""
        instance, first_run = self.reader.instance, self.first_run
        resumed = wait_until(
            lambda: instance.get_runs(RunsFilter(tags={"dagster/parent_run_id": first_run})),
            timeout=150,
            what="the automatic resume",
            detail=self.story,
        )[0]
        resumed_after = time.monotonic() - self.killed_at
        status = wait_until(
            lambda: (
                st
                if (st := self.reader.status(self.batch)) is not None and st["status"] == "succeeded"
                else None
            ),
            timeout=240,
            interval=0.25,
            what="the resumed batch to succeed",
        )
        lineage = instance.get_runs(RunsFilter(tags={BATCH_TAG: self.batch}))
        return Recovery(
            dropped_s=dropped_s,
            resumed_s=resumed_after,
            succeeded_s=time.monotonic() - self.killed_at,
            status=status,
            failed=run_of(instance, first_run),
            resumed=run_of(instance, resumed.run_id),
            lineage=lineage,
            lineage_story="\n".join(diagnose(instance, r.run_id) for r in reversed(lineage)),
        )


#: The tutorial's modules as a daemon launches them: the job and the op whose ``size`` sets a batch.
TUTORIAL_JOBS = {
    "postcards": LaunchedJob("postcards", "recipients"),
    "greetings": LaunchedJob("greetings", "guests"),
}


def postcards_served_by_a_daemon(
    home: Path,
    folder: Path,
    shop: Path,
    logs: Path,
    *,
    supervised: bool = False,
    module: str = "postcards",
    **extra: object,
) -> tuple[dict[str, str], CodeServer, DagsterDev]:
    """The tutorial's location in ``folder`` served by a code server of its own and `dagster dev`,
    as a user's host runs it: 400 cards at 40 ms, 4 at a time, give ~4 s of sending to kill inside;
    the automatic resume looks every second, 2 s after a loss. ``supervised``: the code server is
    run by `job serve-location`, which restarts it. ``module``: the page's two-step ``postcards``
    or five-step ``greetings``. ``extra``: more environment."""
    env = job_env(
        home,
        lease_ttl_s=2.0,
        DURABLE_CODE_LOCATION=module,
        PRINT_SHOP_DB=str(shop),
        PRINT_SHOP_LATENCY_MS=40,
        MAX_CARDS_PER_BATCH=1000,
        DURABLE_AUTO_RESUME_AFTER_S=2,
        DURABLE_AUTO_RESUME_INTERVAL_S=1,
        **extra,
    )
    kind = SupervisedCodeServer if supervised else CodeServer
    code = kind(env, logs, module=module, working_dir=folder, location=module)
    dev = DagsterDev(home, env, logs, code_server=code, job=TUTORIAL_JOBS[module])
    return env, code, dev
