"""Start, resume and cancel batches: the operations behind the CLI and the HTTP API.

A batch is a Dagster run lineage tagged ``durable/batch=ID``. The process that calls
:func:`start_batch` or :func:`resume_batch` is the run worker (in-process executor); it takes the
batch's lease *before* it creates the run, so two starts or two resumes of one batch can never
both proceed, and it heartbeats until the run ends.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from dagster import (
    DagsterInstance,
    DagsterInvalidConfigError,
    DagsterRun,
    DagsterRunStatus,
    execute_job,
)

from durable_assets.errors import (
    BatchExistsError,
    LeaseHeldError,
    ProviderAccountMismatchError,
    UnknownBatchError,
    UnsetVariableError,
)
from durable_assets.kit.runtime import (
    BATCH_TAG,
    DEFAULT_SHARDS,
    EXECUTOR_TAG,
    MAX_RETRIES_TAG,
    PENDING_RUN,
    SHARDS_TAG,
    WORKER_LOST_CANCELED,
    WORKER_LOST_LEASE_EXPIRED,
    WORKER_LOST_TAG,
    AccountBindings,
    CancelStore,
    CrashPoint,
    DurableDatabase,
    ExecutorKind,
    Heartbeat,
    LeaseStore,
    ProviderAccount,
    acquire_unless_live_run,
    crash_point,
    mismatch_message,
    now,
    process_owner,
    run_ended,
)
from durable_assets.ops.batch_log import batch_output
from durable_assets.ops.code_changes import reconcile_code_on_resume
from durable_assets.ops.guardrails import pin_at_run, reconcile_on_resume
from durable_assets.ops.instance import check_shared_storage, ensure_instance_config
from durable_assets.ops.reexecution import LIVE, batch_tags, from_failure, record_run_success
from durable_assets.ops.registry import (
    durable_jobs,
    executor_tags_of_runs,
    job_of_runs,
    reconstructable_job,
    shards_of_runs,
)
from durable_assets.ops.settings import lease_ttl_s
from durable_assets.ops.status import batch_runs, check_batch_id, step_states, worker_lost
from durable_assets.ops.status_model import StepStatus
from durable_assets.ops.stored_files import store_input
from durable_assets.ops.webhooks import batch as batch_webhooks
from durable_assets.settings import InstanceSettings

#: Dagster's console logger prints every event at DEBUG; the CLI shows its own progress instead.
QUIET_LOGS: dict[str, Any] = {"loggers": {"console": {"config": {"log_level": "WARNING"}}}}


def resolve_dagster_home() -> tuple[Path, str]:
    """DAGSTER_HOME if set, else ./dagster_home if present, else ~/.durable_assets (docs/contract.md);
    with the project's dagster.yaml (written if missing, checked if present: ops/instance.py).

    The environment is left as the shell set it: the instance is opened from this folder
    (``DagsterInstance.from_config``), Dagster's own child processes get its ref, and the processes
    we start ourselves (a worker's pool, a supervised code server) are given the folder explicitly."""
    configured = InstanceSettings.current().dagster_home
    if configured:
        # Dagster requires an absolute path; a relative one means what the shell means by it.
        return ensure_instance_config(Path(configured).absolute()), "DAGSTER_HOME"
    local = Path.cwd() / "dagster_home"
    home, why = (local, "./dagster_home") if local.is_dir() else (Path.home() / ".durable_assets", "default")
    return ensure_instance_config(home.resolve()), why  # made there, unless the shell contradicts it


def distributed_tags(shards: int) -> dict[str, str]:
    """What marks a run as distributed, for the resume, status and the automatic resume to see."""
    return {EXECUTOR_TAG: ExecutorKind.CELERY.value, SHARDS_TAG: str(shards)}


@contextmanager
def _holding_lease(instance: DagsterInstance, batch_id: str) -> Iterator[LeaseStore]:
    store = LeaseStore(DurableDatabase.for_instance(instance), ttl_s=lease_ttl_s())
    lease = acquire_unless_live_run(store, batch_id, PENDING_RUN, run_ended(instance), owner=process_owner())
    heartbeat = Heartbeat(store, lease).start()
    try:
        yield store
    finally:
        heartbeat.stop(release=True)


#: Dagster's words for a resource's ``EnvVar`` whose variable is unset (dagster/_config/source.py),
#: and the config path its error names (``root:resources:<key>:config:<field>``): the only place
#: either is said. tests/ops/test_cli_errors.py runs the pinned Dagster through both.
_UNSET_VARIABLE = re.compile(r'environment variable "(?P<name>[^"]+)" which is not set')
_CONFIG_PATH = re.compile(r"at path (?P<path>\S+)")


def unset_variables_error(exc: DagsterInvalidConfigError) -> UnsetVariableError | None:
    """The one line for a run refused because resources read environment variables that are not
    set: each variable, and the resource field that reads it. None for any other config error."""
    found: dict[str, str] = {}
    for error in exc.errors:
        message = str(getattr(error, "message", ""))
        unset = _UNSET_VARIABLE.search(message)
        if unset is None:
            return None  # Dagster's own message says what else is wrong
        path = _CONFIG_PATH.search(message)
        parts = path.group("path").split(":") if path else []
        if parts[1:2] == ["resources"] and parts[3:4] == ["config"] and len(parts) > 4:
            where = f"resource {parts[2]!r} reads it for {'.'.join(parts[4:])!r}"
        else:
            where = f"{':'.join(parts[1:]) or 'the run config'} reads it"
        found.setdefault(unset.group("name"), where)
    if not found:
        return None
    if len(found) == 1:
        [(name, where)] = found.items()
        said = f"environment variable {name} is not set ({where})"
    else:
        whys = "; ".join(f"{name}: {where}" for name, where in found.items())
        said = f"environment variables {', '.join(found)} are not set ({whys})"
    return UnsetVariableError(f"{said}; set {'it' if len(found) == 1 else 'them'} and run the command again")


@contextmanager
def _unset_variables_named() -> Iterator[None]:
    """A run Dagster refuses before it starts because an ``EnvVar`` is unset: a usage error naming
    the variable (exit 2), not Dagster's config dump."""
    try:
        yield
    except DagsterInvalidConfigError as exc:
        named = unset_variables_error(exc)
        if named is None:
            raise
        raise named from exc


def start_batch(
    instance: DagsterInstance,
    batch_id: str,
    *,
    job: str | None = None,
    input_path: str | None = None,
    size: int = 1000,
    executor: ExecutorKind = ExecutorKind.IN_PROCESS,
    shards: int = DEFAULT_SHARDS,
) -> DagsterRun:
    """Run a new batch of durable job ``job`` (the default one if None) to the end in this process.

    With ``executor=CELERY`` this process orchestrates and `job worker`s run the steps, each shard
    step split into ``shards`` tasks. Returns the finished run. Its terminal webhook is sent from
    here (bounded) after the lease is released: no daemon needed.
    """
    check_batch_id(batch_id)
    durable = durable_jobs().get(job)
    batch_webhooks.settings()  # a broken webhook configuration fails before the run, not after it
    account = configured_account(instance)  # a provider we cannot use fails before the batch exists
    with _holding_lease(instance, batch_id):
        if batch_runs(instance, batch_id):
            raise BatchExistsError(
                f"batch {batch_id!r} already exists; use `job resume --id {batch_id}` or a new ID"
            )
        if account is not None:
            AccountBindings(DurableDatabase.for_instance(instance)).bind(batch_id, account)
        pin_at_run(DurableDatabase.for_instance(instance), batch_id, durable)
        instance.add_dynamic_partitions(durable.partitions_name, [batch_id])
        # On shared storage the input's bytes are stored with the batch: every host and resume reads them.
        config = durable.run_config(store_input(instance, batch_id, input_path), size)
        distributed = executor == ExecutorKind.CELERY
        tags = {**batch_tags(batch_id), **(distributed_tags(shards) if distributed else {})}
        with batch_output(instance, batch_id, "run"), _unset_variables_named():
            result = execute_job(
                reconstructable_job(durable, shards if distributed else None),
                instance,
                run_config={**config, **QUIET_LOGS},
                tags=tags,
            )
        crash_point(CrashPoint.RUN_END)
    batch_webhooks.notify_batch(instance, batch_id)
    return _reload(instance, result.run_id)


def resume_batch(
    instance: DagsterInstance,
    batch_id: str,
    *,
    on_plan: Callable[[list[str], list[str]], None] | None = None,
    wait_s: float | None = None,
    override_guardrails: bool = False,
    accept_code_change: bool = False,
    say: Callable[[str], None] | None = None,
) -> DagsterRun | None:
    """Continue a batch from its last committed step; None when it had already succeeded.

    A newest run that still looks alive is taken over only when its lease has lapsed (its worker
    is dead); it is then marked failed with the reason, and re-executed from failure. With
    ``wait_s``, a worker that still holds the lease is waited for that long (its lease lapses if it
    is dead or frozen) instead of refused at once. ``on_plan`` hears, once the lease is held, the
    steps skipped (committed) and the steps about to run; ``say`` hears what the resume waits for
    and which guardrails it keeps (the batch's) or, with ``override_guardrails``, replaces. A step
    about to run whose deployed code changed since the batch started, and that has recorded effects,
    refuses the resume before anything runs (:class:`CodeChangedError`, exit 2) unless
    ``accept_code_change``.
    """
    check_batch_id(batch_id)
    runs = batch_runs(instance, batch_id)
    if not runs:
        raise UnknownBatchError(f"no batch {batch_id!r} to resume in {instance.root_directory}")
    if executor_tags_of_runs(runs).get(EXECUTOR_TAG) == ExecutorKind.CELERY.value:
        check_shared_storage(
            Path(instance.root_directory),
            f"batch {batch_id} ran with --executor celery: its resume",
            "resume it on the instance it ran on",
        )
    batch_webhooks.settings()
    db = DurableDatabase.for_instance(instance)
    if runs[-1].status != DagsterRunStatus.SUCCESS:
        _refuse_other_account(db, batch_id, configured_account(instance))
        # (a holder waited for may finish the batch meanwhile: then there is nothing to do)
        newest = _wait_for_worker(instance, LeaseStore(db, ttl_s=lease_ttl_s()), batch_id, wait_s, say)
    else:
        newest = runs[-1]
    if newest.status == DagsterRunStatus.SUCCESS:
        batch_webhooks.notify_batch(instance, batch_id)  # delivers what an earlier process left pending
        return None
    if newest.status not in LIVE:
        # The end this resume leaves is an event even if the process that saw it died before
        # enqueueing it; it goes out with the new run's event after the re-execution.
        batch_webhooks.enqueue_if_terminal(instance, newest.run_id)
    finished_without_reexecution = False
    with _holding_lease(instance, batch_id) as leases:
        runs = batch_runs(instance, batch_id)
        if runs[-1].run_id != newest.run_id:
            # Someone else (the daemon's automatic resume, another `job resume`) moved the batch on
            # between our look and our lease: theirs is the resume; starting a second one would race it.
            raise LeaseHeldError(
                f"batch {batch_id!r} was just resumed by run {runs[-1].run_id}, which took its lease "
                f"first; follow it with `job status --id {batch_id}`"
            )
        newest = runs[-1]
        states = step_states(instance, runs)
        if on_plan is not None:
            on_plan(
                [s for s, state in states.items() if state == StepStatus.COMPLETED],
                [s for s, state in states.items() if state != StepStatus.COMPLETED],
            )
        if all(state == StepStatus.COMPLETED for state in states.values()):
            # The worker died after the last step committed but before Dagster recorded the run's
            # end: there is nothing to re-execute (Dagster rejects an empty plan), so finish it.
            record_run_success(instance, newest, batch_id, by="`job resume`")
            finished_without_reexecution = True
        elif newest.status in LIVE:
            previous = leases.get(batch_id)
            # max_retries=0 on the dead run only: this resume re-executes it, so the daemon's run
            # retries (which would see a failure with no reason and retry it too) must not.
            instance.add_run_tags(
                newest.run_id, {WORKER_LOST_TAG: WORKER_LOST_LEASE_EXPIRED, MAX_RETRIES_TAG: "0"}
            )
            instance.report_run_failed(
                newest,
                message=(
                    f"durable-assets: the run worker stopped renewing its lease on batch {batch_id!r} "
                    f"(last holder: {previous.owner if previous else 'unknown'}); marked failed by "
                    f"`job resume` so the batch can be re-executed from failure."
                ),
            )
        if not finished_without_reexecution:
            to_run = [s for s, state in states.items() if state != StepStatus.COMPLETED]
            code_line = reconcile_code_on_resume(
                db, batch_id, job_of_runs(runs), runs, to_run, accept=accept_code_change
            )
            line = reconcile_on_resume(db, batch_id, job_of_runs(runs), override=override_guardrails)
            for said in (code_line, line):
                if said and say is not None:
                    say(said)
            CancelStore(db).clear(batch_id)
            # As the lineage first ran: the sharded job, or the location's job, in process or (a
            # batch launched distributed from the UI or a schedule) on the workers again.
            tags = {**batch_tags(batch_id), **executor_tags_of_runs(runs)}
            job = reconstructable_job(job_of_runs(runs), shards_of_runs(runs))
            parent = instance.get_run_by_id(newest.run_id) or newest  # as failed just now, if it was live
            with batch_output(instance, batch_id, "resume"), _unset_variables_named():
                result = execute_job(
                    job,
                    instance,
                    reexecution_options=from_failure(instance, job, parent),
                    tags=tags,
                )
        crash_point(CrashPoint.RUN_END)
    batch_webhooks.notify_batch(instance, batch_id)
    return None if finished_without_reexecution else _reload(instance, result.run_id)


def configured_account(instance: DagsterInstance) -> ProviderAccount | None:
    """The provider account the code location's effects go to now (None if its jobs name none)."""
    resolve = durable_jobs().provider_account
    return None if resolve is None else resolve(Path(instance.root_directory))


def _refuse_other_account(db: DurableDatabase, batch_id: str, account: ProviderAccount | None) -> None:
    """A batch continues only at the account it started with (its keys and provider IDs are there);
    a batch from before accounts were recorded is bound to the configured one now."""
    if account is None:
        return
    bindings = AccountBindings(db)
    bound = bindings.get(batch_id)
    if bound is not None and bound != account:
        raise ProviderAccountMismatchError(mismatch_message(batch_id, bound, account))
    bindings.bind(batch_id, account)


def _wait_for_worker(
    instance: DagsterInstance,
    leases: LeaseStore,
    batch_id: str,
    wait_s: float | None,
    say: Callable[[str], None] | None,
) -> DagsterRun:
    """The batch's newest run once no live worker holds it: at once, or (``wait_s``) once the
    holder's lease has lapsed, re-checked at its expiry; past the deadline, LeaseHeldError as without
    waiting. The newest run is read again each time: the holder may finish, or the daemon resume it."""
    deadline = time.monotonic() + (wait_s or 0.0)
    told = False
    while True:
        newest = batch_runs(instance, batch_id)[-1]
        try:
            _refuse_if_worker_alive(instance, leases, newest)
            return newest
        except LeaseHeldError:
            left = deadline - time.monotonic()
            if wait_s is None or left <= 0:
                raise
            lease = leases.get(batch_id)
            if not told and say is not None:
                holder = (
                    f"{lease.owner} (run {lease.run_id})" if lease is not None else f"run {newest.run_id}"
                )
                say(
                    f"resume: waiting up to {left:.0f} s for the lease of batch {batch_id} held by {holder} "
                    "to lapse (a dead or frozen worker stops renewing it)"
                )
                told = True
            # Sleep until the lease would lapse (plus a margin), never past the deadline, and look
            # again at least every second: a live holder renews, a finishing one releases.
            until_lapse = (lease.seconds_left() + 0.05) if lease is not None else 0.25
            time.sleep(max(0.05, min(until_lapse, left, 1.0)))


def _refuse_if_worker_alive(instance: DagsterInstance, leases: LeaseStore, run: DagsterRun) -> None:
    if run.status not in LIVE:
        return
    lease = leases.get(run.tags.get(BATCH_TAG, ""))
    if lease is not None and lease.is_live():
        raise LeaseHeldError(
            f"batch {run.tags.get(BATCH_TAG)!r} is still being run by {lease.owner} (run {lease.run_id}); "
            f"its lease expires in {lease.seconds_left():.1f} s if that worker is dead. Try again then, "
            "or `job cancel` it."
        )
    if lease is None or lease.run_id != run.run_id:
        # The run has not taken the lease (a lapsed one is an earlier run's): it is queued, starting,
        # or its worker died right after starting. Only the last is ours to take over; a queued run
        # of the daemon's (e.g. its automatic resume) would otherwise start beside this resume.
        record = instance.get_run_record_by_id(run.run_id)
        started = record.start_time if record and record.start_time else None
        if started is None and run.remote_job_origin is not None:
            raise LeaseHeldError(
                f"run {run.run_id} of batch {run.tags.get(BATCH_TAG)!r} is {run.status.value.lower()} and "
                "has not started (nor taken the batch's lease) yet; it continues the batch once the daemon "
                "launches it (or `job cancel` it)"
            )
        # A CLI run that never started (its process died right after creating it) is dead once the
        # lease it would have adopted has lapsed; without any lease, wait for one as before.
        if (started is None and lease is None) or (started is not None and now() - started < leases.ttl_s):
            raise LeaseHeldError(
                f"run {run.run_id} of batch {run.tags.get(BATCH_TAG)!r} has not taken its lease yet; "
                f"try again in {leases.ttl_s:.0f} s"
            )


#: `job cancel`'s answer when the batch's run is recorded canceled on the spot (its worker is lost).
CANCELED = "canceled"


def cancel_batch(instance: DagsterInstance, batch_id: str) -> str:
    """Record a cancel (committed before we answer) and mark the live run canceling; a run whose
    worker is lost (lease lapsed) is marked canceled at once, since no worker will ever stop it."""
    check_batch_id(batch_id)
    runs = batch_runs(instance, batch_id)
    if not runs:
        raise UnknownBatchError(f"no batch {batch_id!r} to cancel in {instance.root_directory}")
    newest = runs[-1]
    if newest.status not in LIVE:
        return "already finished"
    db = DurableDatabase.for_instance(instance)
    # Recorded first in every case: a worker that was only frozen (SIGSTOP) stops at its next check.
    CancelStore(db).request(batch_id)
    if worker_lost(instance, newest, LeaseStore(db).get(batch_id), lease_ttl_s()):
        instance.add_run_tags(newest.run_id, {WORKER_LOST_TAG: WORKER_LOST_CANCELED})
        instance.report_run_canceled(
            newest,
            message=(
                "canceled by `job cancel`: its worker was lost (its lease lapsed); "
                f"`job resume --id {batch_id}` continues the batch"
            ),
        )
        batch_webhooks.notify_batch(instance, batch_id, budget_s=0)
        return CANCELED
    if newest.status in (DagsterRunStatus.QUEUED, DagsterRunStatus.NOT_STARTED):
        instance.report_run_canceled(newest, message="canceled before it started (job cancel)")
        # No worker will ever pick this run up, so nobody else sends its end: one pass, no waiting.
        batch_webhooks.notify_batch(instance, batch_id, budget_s=0)
    elif newest.status != DagsterRunStatus.CANCELING:
        instance.report_run_canceling(newest, message="cancel requested (durable-assets)")
    return "cancel requested"


def _reload(instance: DagsterInstance, run_id: str) -> DagsterRun:
    run = instance.get_run_by_id(run_id)
    if run is None:  # pragma: no cover - the run was just written by this process
        raise UnknownBatchError(f"run {run_id} vanished from the instance")
    return run
