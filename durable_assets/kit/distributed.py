"""Distributed execution: a batch's steps as Celery tasks on any number of `job worker` processes.

Modelled on dagster-celery's step execution (the task body follows its ``execute_plan`` task; the
orchestrator's loop follows its ``core_celery_execution_loop``, which it cannot call: see
``DurableCeleryExecutor._loop``), with what a batch with side effects needs on top, because a
Celery task can vanish without a result:

- **Our own app and task** (``durable_assets.execute_step``): ``acks_late`` and
  ``reject_on_worker_lost``, so a task whose worker is SIGKILLed goes back to the queue instead of
  being lost; prefetch 1, so a worker never sits on tasks another could run; a 10 s broker
  heartbeat, so a frozen worker's connection (and its unacknowledged task) is given up.
- **Step leases** (``durable_step_leases``): the task renews a row for its (run, step) every TTL/3.
  The orchestrator polls the rows; a step whose task neither finished nor renewed within
  ``DURABLE_STEP_LEASE_TTL_S`` is sent again (a new *attempt*), up to ``DURABLE_STEP_MAX_ATTEMPTS``,
  and then failed cleanly so that `job resume` finishes the batch. A newer execution of a step
  supersedes an older one, which stops before its next provider request.
- **Fencing across hosts**: the orchestrator adopts the batch's run lease; a task may cause side
  effects only while its run still holds that lease (same fence): the tasks of a run that `job
  resume` replaced stop as a local orphan does. The cancel row is checked before every request.

The ledger, not any of this, is what makes a side effect happen once: two executions of one step
send the same idempotency keys. Leases only keep duplicates rare and bound how long a dead task
delays its batch.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from celery.exceptions import TaskRevokedError
from celery.result import AsyncResult
from dagster import (
    DagsterEvent,
    DagsterSubprocessError,
    Executor,
    executor,
    multiple_process_executor_requirements,
)
from dagster_shared.serdes import deserialize_value

from durable_assets.kit.celery_app import TASK_NAME, app, queue_of, workers_answer
from durable_assets.kit.dagster_internals import (
    EngineEventData,
    ExecuteStepArgs,
    ExecutionPlan,
    InstanceConcurrencyContext,
    PlanOrchestrationContext,
    RetryMode,
    SerializableErrorInfo,
    pack_value,
    serializable_error_info_from_exc_info,
)
from durable_assets.kit.db import (
    DurableDatabase,
    now,
)
from durable_assets.kit.executor import celery_config_fields
from durable_assets.kit.interrupts import stop_requested
from durable_assets.kit.leases import Heartbeat, LeaseStore, acquire_unless_live_run, process_owner
from durable_assets.kit.settings import DistributedSettings, KitSettings
from durable_assets.kit.step_leases import StepLeaseStore
from durable_assets.kit.step_task import TaskOutcome
from durable_assets.kit.tags import BATCH_TAG, PARTITION_TAG

#: How often the orchestrator looks for finished tasks: often for a second after something changed
#: (a result came in, a step was sent), since short tasks follow one another closely, then at the
#: slower pace, so a long step is not polled 100 times a second throughout. Each look is one cheap
#: read per task in flight. At a fixed 0.1 s a worker idled 30 ms between short tasks, of a task's
#: ~170 ms overhead; 10 ms at 0.02 s (bench/task_overhead.py), half the tick: at 0.01 s the mean
#: wait is 5 ms, for ~100 reads a second of one reply queue while steps follow one another ...
RESULT_TICK_S = 0.1
RESULT_TICK_BUSY_S = 0.01
BUSY_FOR_S = 1.0
#: ... and for lapsed step leases (one query for all of the run's steps).
LEASE_POLL_S = 1.0


# --- the orchestrator's side: the executor --------------------------------------------------


@executor(
    name="durable_celery",
    config_schema=celery_config_fields(),
    requirements=multiple_process_executor_requirements(),
)
def durable_celery_executor(init_context: Any) -> DurableCeleryExecutor:
    """dagster-celery's executor with step leases, re-sends and fencing (see the module docstring)."""
    config = init_context.executor_config
    retries = RetryMode.from_config(config["retries"])
    return DurableCeleryExecutor(
        retries if retries is not None else RetryMode.ENABLED,
        ExecutorKnobs(config["lease_ttl_s"], config["step_lease_ttl_s"], config["step_max_attempts"]),
    )


def executor_config(settings: KitSettings, distributed: DistributedSettings) -> dict[str, Any]:
    """The executor's config as a code location wires it (its environment's values)."""
    return {
        "retries": {"enabled": {}},
        "lease_ttl_s": settings.lease_ttl_s,
        "step_lease_ttl_s": distributed.step_lease_ttl_s,
        "step_max_attempts": distributed.step_max_attempts,
    }


@dataclass(frozen=True)
class ExecutorKnobs:
    """The executor's config: the batch lease it holds, and how it watches its steps' tasks."""

    lease_ttl_s: float
    step_lease_ttl_s: float
    step_max_attempts: int


@dataclass
class _InFlight:
    attempt: int
    results: list[AsyncResult]
    sent_at: float


@dataclass
class _Steps:
    """The loop's state, as its helpers share it: the run's plan as it executes, the steps whose
    tasks are out (each with its copies' results), how often each step was sent, and how to send one."""

    ctx: PlanOrchestrationContext
    active: Any
    knobs: ExecutorKnobs
    store: StepLeaseStore
    send: Callable[[Any, Any], AsyncResult]
    in_flight: dict[str, _InFlight]
    sends: dict[str, int]


class DurableCeleryExecutor(Executor):
    def __init__(self, retries: RetryMode, knobs: ExecutorKnobs) -> None:
        self._retries = retries
        self._knobs = knobs

    @property
    def retries(self) -> RetryMode:
        return self._retries

    def execute(
        self, plan_context: PlanOrchestrationContext, execution_plan: ExecutionPlan
    ) -> Iterator[DagsterEvent]:
        knobs = self._knobs
        instance = plan_context.instance
        run = plan_context.dagster_run
        db = DurableDatabase.for_instance(instance)
        batch_id = run.tags.get(BATCH_TAG) or run.tags.get(PARTITION_TAG)
        heartbeat: Heartbeat | None = None
        if batch_id:
            leases = LeaseStore(db, ttl_s=knobs.lease_ttl_s)

            def ended(run_id: str) -> bool:
                other = instance.get_run_by_id(run_id)
                return other is not None and other.is_finished

            # The orchestrator is the batch's lease holder: tasks may act only while this run holds it.
            lease = acquire_unless_live_run(leases, batch_id, run.run_id, ended, owner=process_owner())
            heartbeat = Heartbeat(leases, lease).start()
        try:
            yield from self._loop(plan_context, execution_plan, StepLeaseStore(db, knobs.step_lease_ttl_s))
        finally:
            if heartbeat is not None:
                heartbeat.stop(release=False)  # released by the CLI once the run's end is recorded

    def _loop(
        self, ctx: PlanOrchestrationContext, plan: ExecutionPlan, step_store: StepLeaseStore
    ) -> Iterator[DagsterEvent]:
        """dagster-celery's loop, extended; a copy because its signature has no room for the extension.

        ``dagster_celery.core_execution_loop.core_celery_execution_loop(job_context,
        execution_plan, step_execution_fn)`` (dagster-celery 0.29.27) takes one seam,
        ``step_execution_fn(app, plan_context, step, queue, priority, known_state) -> AsyncResult``,
        called once when a step is first sent. What we add does not fit through it:

        - **One result per step, and a ready result ends the step.** It keeps
          ``step_results[step.key]`` and, once that is ready, pops the step and calls
          ``verify_complete``. A step here has several results (a re-sent copy beside one still
          queued), and a copy that answers "superseded" must not end it.
        - **The answer must be the event list** (``for step_event in result.get()``); our task
          answers ``{"outcome", "events"}`` so that a stale copy can stand down.
        - **A revoked task ends its step** (``TaskRevokedError`` is logged and the step popped);
          we revoke superseded copies as a matter of course.
        - **Nothing runs between ticks**, and its ``active_execution`` is local: there is no place
          for the step-lease poll that re-sends a step whose worker died or froze, and no way to
          fail a step lost ``DURABLE_STEP_MAX_ATTEMPTS`` times with a step failure event
          (``handle_event``), which honours the step's retry policy and lets `job resume` finish
          the batch. An ``AsyncResult`` look-alike could hide re-sends inside ``ready()``, but its
          only way to fail a step is to raise from ``get()``, which that loop records as a
          worker error: it sends no further step and raises ``DagsterSubprocessError`` for the run.
        - It builds dagster-celery's app from ``job_context.executor.app_args()`` (its queue
          ``dagster``, its priorities) and ticks every second (``TICK_SECONDS``); ours ticks
          every 0.01 s for a second after a change, then every 0.1 s, on our own app and queue.

        So the loop keeps dagster-celery's shape (same order: interrupts, results, plan events,
        new steps) and adds the lease poll and re-sends; compare the two side by side on upgrade.
        """
        knobs = self._knobs
        celery = app()
        queue = queue_of(celery)
        task = celery.tasks[TASK_NAME]
        if not workers_answer(celery, queue):
            warning = (
                f"no `job worker` consumes queue {queue!r} on {str(celery.conf.broker_url).split('@')[-1]}; "
                "the steps wait in the queue until one starts"
            )
            ctx.log.warning(warning)  # the batch's log (and the terminal with --verbose)
            yield DagsterEvent.engine_event(ctx, warning, EngineEventData())
        in_flight: dict[str, _InFlight] = {}
        sends: dict[str, int] = {}
        step_errors: dict[str, SerializableErrorInfo] = {}
        last_lease_poll = 0.0
        last_change = time.monotonic()
        run_id = ctx.dagster_run.run_id

        def send(step: Any, known_state: Any) -> AsyncResult:
            sends[step.key] = sends.get(step.key, 0) + 1
            args = ExecuteStepArgs(
                job_origin=ctx.reconstructable_job.get_python_origin(),
                run_id=run_id,
                step_keys_to_execute=[step.key],
                instance_ref=ctx.instance.get_ref(),
                retry_mode=self.retries.for_inner_plan(),
                known_state=known_state,
                print_serialized_events=True,
            )
            return task.apply_async(
                kwargs={
                    "execute_step_args_packed": pack_value(args),
                    "executable_dict": ctx.reconstructable_job.to_dict(),
                    "attempt": sends[step.key],
                    "step_lease_ttl_s": knobs.step_lease_ttl_s,
                },
                queue=queue,
                routing_key=queue,
            )

        with (
            InstanceConcurrencyContext(ctx.instance, ctx.dagster_run) as concurrency,
            plan.start(retry_mode=self.retries, instance_concurrency_context=concurrency) as active,
        ):
            steps = _Steps(ctx, active, knobs, step_store, send, in_flight, sends)
            signalled = False
            while not active.is_complete or in_flight:
                if active.check_for_interrupts():
                    yield DagsterEvent.engine_event(
                        ctx, "durable executor: interrupted; revoking the run's tasks", EngineEventData()
                    )
                    active.mark_interrupted()
                    for flight in in_flight.values():
                        for r in flight.results:
                            r.revoke()
                    in_flight.clear()
                    break
                if stop_requested() is not None:
                    # Ctrl-C or SIGTERM of the process this loop runs in (ops/interrupts.py, which also
                    # commits the stop for the run's tasks): a step no worker has started never will.
                    if not signalled:
                        signalled = True
                        yield DagsterEvent.engine_event(
                            ctx,
                            "durable executor: stop requested; revoking the steps no worker has started "
                            "and waiting for the running ones to reach their safe point",
                            EngineEventData(),
                        )
                        for flight in in_flight.values():
                            for r in flight.results:
                                r.revoke()  # no terminate: a running task stops at its own safe point
                    for step_key in self._not_running(steps):
                        in_flight.pop(step_key)
                    if not in_flight:
                        active.mark_interrupted()
                        break
                done: list[str] = []
                for step_key, flight in list(in_flight.items()):
                    for result in list(flight.results):
                        if not result.ready():
                            continue
                        flight.results.remove(result)
                        try:
                            answer = result.get(disable_sync_subtasks=False)
                        except TaskRevokedError:
                            continue
                        except Exception:
                            step_errors[step_key] = serializable_error_info_from_exc_info(sys.exc_info())
                            done.append(step_key)
                            break
                        if answer.get("outcome") != TaskOutcome.RAN.value:
                            continue  # a stale copy stood down; the current one still runs
                        for raw in answer.get("events", []):
                            event = deserialize_value(raw, DagsterEvent)
                            yield event
                            active.handle_event(event)
                        for other in flight.results:
                            other.revoke()  # a queued copy of a step that is done
                        done.append(step_key)
                        break
                    else:
                        if not flight.results and step_key not in done:
                            # Every copy stood down without running: the step's current execution
                            # is gone (it finished without a result reaching us, or was lost).
                            yield from self._resend_or_fail(steps, step_key, flight)
                changed = bool(done)
                for step_key in done:
                    in_flight.pop(step_key, None)
                    active.verify_complete(ctx, step_key)
                yield from active.plan_events_iterator(ctx)
                t = time.monotonic()
                if in_flight and t - last_lease_poll >= LEASE_POLL_S:
                    last_lease_poll = t
                    yield from self._check_leases(steps)
                if signalled or step_errors:
                    time.sleep(RESULT_TICK_S)
                    continue
                for step in active.get_steps_to_execute():
                    # Sent first, then the event written (an INSERT and a NOTIFY): the write is
                    # no longer between one task's end and the next one's start on a worker.
                    result = send(step, active.get_known_state())
                    in_flight[step.key] = _InFlight(sends[step.key], [result], now())
                    changed = True
                    yield DagsterEvent.engine_event(
                        ctx.for_step(step),
                        f"Sending step {step.key} to queue {queue!r}",
                        EngineEventData(),
                    )
                if changed:
                    last_change = time.monotonic()
                busy = time.monotonic() - last_change < BUSY_FOR_S
                time.sleep(RESULT_TICK_BUSY_S if busy else RESULT_TICK_S)
        if step_errors:
            raise DagsterSubprocessError(
                "errors in workers:\n" + "\n".join(f"[{k}]: {e.to_string()}" for k, e in step_errors.items()),
                subprocess_error_infos=list(step_errors.values()),
            )

    def _not_running(self, steps: _Steps) -> list[str]:
        """The in-flight steps whose current execution no worker holds (still queued, or its worker
        lost): nothing to wait for once the run stops. A finished one is waited for: its answer
        carries the step's events. A task a worker takes after this read finds
        the stop committed for its run and sends nothing (and the run's lease fences it out)."""
        try:
            rows = steps.store.of_run(steps.ctx.dagster_run.run_id)
        except Exception:  # a database hiccup: wait for the next tick rather than guess
            return []
        return [
            step_key
            for step_key, flight in steps.in_flight.items()
            if (row := rows.get(step_key)) is None
            or (not row.finished and (row.attempt != flight.attempt or row.lapsed))
        ]

    def _check_leases(self, steps: _Steps) -> Iterator[DagsterEvent]:
        """Re-send each step whose current execution stopped renewing its lease (its worker is lost)."""
        try:
            rows = steps.store.of_run(steps.ctx.dagster_run.run_id)
        except Exception:  # a database hiccup: look again next second
            return
        for step_key, flight in list(steps.in_flight.items()):
            row = rows.get(step_key)
            if row is None or row.finished or row.attempt != flight.attempt or not row.lapsed:
                continue  # queued, done, an older execution's row, or alive
            yield from self._resend_or_fail(steps, step_key, flight)

    def _resend_or_fail(self, steps: _Steps, step_key: str, flight: _InFlight) -> Iterator[DagsterEvent]:
        ctx, active, knobs, sends = steps.ctx, steps.active, steps.knobs, steps.sends
        step = active.get_step_by_key(step_key)
        if sends.get(step_key, 0) >= knobs.step_max_attempts:
            message = (
                f"step {step_key}'s task was lost {sends[step_key]} times (no lease renewal within "
                f"{knobs.step_lease_ttl_s:g} s); failed so that `job resume` can finish the batch "
                "(DURABLE_STEP_MAX_ATTEMPTS)"
            )
            for r in flight.results:
                r.revoke()
            flight.results.clear()
            error = SerializableErrorInfo(message, [], "StepTaskLostError")
            failure = self.log_failure_or_retry_event_after_error(
                ctx.for_step(step), error, active.get_known_state()
            )
            yield DagsterEvent.engine_event(ctx.for_step(step), message, EngineEventData())
            yield failure
            active.handle_event(failure)
            steps.in_flight.pop(step_key, None)
            return
        yield DagsterEvent.engine_event(
            ctx.for_step(step),
            f"step {step_key}: its task (attempt {flight.attempt}) stopped renewing its lease; "
            "sending it again",
            EngineEventData(),
        )
        for r in flight.results:
            r.revoke()  # a copy still queued somewhere would only stand down
        result = steps.send(step, active.get_known_state())
        flight.attempt = sends[step_key]
        flight.results = [result]
        flight.sent_at = now()
