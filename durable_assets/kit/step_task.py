"""The step task's body, run in a `job worker`'s pool child: one step of a run, holding its lease.

Modelled on dagster-celery's ``execute_plan`` task. The worker keeps one DagsterInstance per
process (its own ``DAGSTER_HOME`` when that holds the run), and a forked child drops its parent's
connections.
"""

from __future__ import annotations

import enum
import logging
import os
import socket
import threading
import uuid
from pathlib import Path
from typing import Any

from dagster import (
    DagsterInstance,
    DagsterRun,
    serialize_value,
)

from durable_assets.kit.dagster_internals import (
    EngineEventData,
    ExecuteStepArgs,
    ReconstructableJob,
    create_execution_plan,
    execute_plan_iterator,
    unpack_value,
)
from durable_assets.kit.db import (
    DurableDatabase,
    hold_connections,
    remember_existing_partitions,
)
from durable_assets.kit.settings import DistributedSettings
from durable_assets.kit.step_leases import StepHeartbeat, StepLeaseStore, TaskContext, current_task
from durable_assets.kit.tags import BATCH_TAG, PARTITION_TAG

_log = logging.getLogger(__name__)

#: The declared defaults (the executor's config schema); the code location passes its environment's.
_DISTRIBUTED = DistributedSettings()


class TaskOutcome(enum.StrEnum):
    """What a step task answers: it ran the step, or a newer (or finished) execution made it stand down."""

    RAN = "ran"
    SUPERSEDED = "superseded"


_instances: dict[str, DagsterInstance | None] = {}
_instances_lock = threading.Lock()

#: The worker's own instance folder, as `job worker` resolved it (None: DAGSTER_HOME, if set).
_own_home: str | None = None


def serve_from_home(home: Path) -> None:
    """Tasks of this process (and of the pool children it forks) use the instance at ``home``
    when it holds their run: the CLI resolved it (``./dagster_home`` when DAGSTER_HOME is unset)
    without writing it into the environment."""
    global _own_home
    _own_home = str(home)


def _open_own() -> DagsterInstance:
    return DagsterInstance.from_config(_own_home) if _own_home is not None else DagsterInstance.get()


def _for_tasks(instance: DagsterInstance) -> DagsterInstance:
    """An instance that serves every task of this worker process: it holds its connections and
    keeps what it learnt that cannot become untrue while a task needs it (that a batch's partition
    exists: ``remember_existing_partitions``)."""
    hold_connections(instance)
    remember_existing_partitions(instance)
    return instance


def _instance(ref: Any) -> DagsterInstance:
    """One DagsterInstance per worker process: opening one per task costs engines and connections."""
    key = serialize_value(ref)
    with _instances_lock:
        instance = _instances.get(key)
        if instance is None:
            instance = _for_tasks(DagsterInstance.from_ref(ref))
            _instances[key] = instance
        return instance


def _worker_instance(ref: Any, run_id: str) -> tuple[DagsterInstance, DagsterRun | None]:
    """The worker's own instance (its ``DAGSTER_HOME``) when it holds the run, else the orchestrator's
    ref; with the run as that instance reads it (the task needs it: one read, not two).

    The ref names the orchestrator's folder (local artifacts, compute logs): on another host that
    path is not there, or worse, is some other instance's. A worker whose own instance shares the
    orchestrator's database finds the run there and writes nothing under the orchestrator's path;
    one that does not (a worker started without a home of its own) keeps opening the ref.
    """
    own = _own_instance()
    run = own.get_run_by_id(run_id) if own is not None else None
    if own is not None and run is not None:
        return own, run
    instance = _instance(ref)
    return instance, instance.get_run_by_id(run_id)


#: The cache key of the worker's own instance (None cached when it has none).
_OWN = "<own DAGSTER_HOME>"


def _own_instance(settle: bool = True) -> DagsterInstance | None:
    """The worker's own instance (opened once per process), or None when it has none.

    ``settle``: whether a failure to open it is final for the process (a task's answer); the
    warm-up's is not, so a worker that starts before its database leaves the question to its
    first task, as it did before there was a warm-up."""
    with _instances_lock:
        own = _instances.get(_OWN)
        if own is None and _OWN not in _instances:
            try:
                own = _for_tasks(_open_own())
            except Exception:  # no home of its own: the ref is all it has
                if not settle:
                    return None
                own = None
            _instances[_OWN] = own
        return own


#: A partition no batch has: what the warm-up asks about (the answer, False, is not remembered).
_WARM_UP_PARTITION = "<durable warm-up>"


def warm_up() -> None:
    """Open this pool child's instance, its storages' connections and their schema checks now,
    not in its first task.

    A child's first task paid ~0.3 s more than the next ones for this (a cProfile of scenario 10's
    tasks: the instance's config and storages, the first connection of each, Dagster's schema
    checks); with 4 fresh workers on a 4-shard step, the one whose first task was a shard started
    it ~0.6 s after the others on a loaded 2-core machine, and the step waited for it. Run in a
    thread of the child as it starts (``worker_process_init``): a task that arrives meanwhile waits
    for the same lock, then finds the instance open. Best effort: anything that fails here fails
    again, and is reported, in the task.
    """
    try:
        own = _own_instance(settle=False)
        if own is None:
            return
        own.get_run_by_id(_WARM_UP_PARTITION)  # run storage: a connection, its schema check
        own.has_dynamic_partition(_WARM_UP_PARTITION, _WARM_UP_PARTITION)  # the event log's
    except Exception as error:  # a warm-up: the first task opens (and reports) what this could not
        _log.debug("worker warm-up did not open the instance (its first task will): %s", error)


def _after_fork_in_child() -> None:
    """A forked pool child must not share its parent's database connections."""
    from durable_assets.kit import db

    for engine in list(db._engines.values()):  # our own module's cache
        engine.dispose(close=False)
    _instances.clear()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


def execute_step(
    self: Any,
    execute_step_args_packed: dict[str, Any],
    executable_dict: dict[str, Any],
    attempt: int,
    step_lease_ttl_s: float = _DISTRIBUTED.step_lease_ttl_s,
) -> dict[str, Any]:
    """Run one step of a run (dagster-celery's task body), holding the step's lease throughout.

    ``step_lease_ttl_s`` comes from the orchestrator's executor config, so both sides agree on it."""
    args = unpack_value(execute_step_args_packed, as_type=ExecuteStepArgs)
    instance, run = _worker_instance(args.instance_ref, args.run_id)
    recon_job = ReconstructableJob.from_dict(executable_dict)
    if run is None:
        raise RuntimeError(f"no run {args.run_id} in this worker's instance")
    step_key = (args.step_keys_to_execute or [""])[0]
    owner = f"{socket.gethostname()}:{os.getpid()}:{self.request.id}:{uuid.uuid4().hex[:8]}"
    store = StepLeaseStore(DurableDatabase.for_instance(instance), ttl_s=step_lease_ttl_s)
    batch_id = run.tags.get(BATCH_TAG) or run.tags.get(PARTITION_TAG) or ""
    if not store.acquire(run.run_id, step_key, batch_id, attempt, owner):
        return {"outcome": TaskOutcome.SUPERSEDED.value, "events": []}
    task = TaskContext(run.run_id, step_key, owner, store)
    token = current_task.set(task)
    try:
        with StepHeartbeat(task):
            plan = create_execution_plan(
                recon_job,
                run.run_config,
                step_keys_to_execute=args.step_keys_to_execute,
                known_state=args.known_state,
            )
            events = [
                instance.report_engine_event(
                    f"Executing step {step_key} in worker {self.request.hostname} (attempt {attempt})",
                    run,
                    EngineEventData({"step_keys": step_key, "worker": str(self.request.hostname)}),
                    step_key=step_key,
                )
            ]
            events.extend(
                execute_plan_iterator(
                    execution_plan=plan,
                    job=recon_job,
                    dagster_run=run,
                    instance=instance,
                    retry_mode=args.retry_mode,
                    run_config=run.run_config,
                )
            )
        store.finish(run.run_id, step_key, owner)
    finally:
        current_task.reset(token)
    return {"outcome": TaskOutcome.RAN.value, "events": [serialize_value(e) for e in events]}
