"""Dagster resources that put the durability kit into any asset job.

``IdempotencyLedger`` is for any mutating op; ``BatchRuntime`` holds the run's lease (heartbeat),
answers "may I still cause side effects?" (cancel + fence) and reports progress. Both find their
tables through the instance, so they follow it to Postgres with no configuration of their own.
Their tuning fields default to the kit's declared defaults (:class:`KitSettings`); the code
location sets them from the environment where it wires the jobs (:func:`default_resources`, called
by ``DurableJobs.definitions``), so no step reads a variable itself and the values show in
Dagster's resource config. ``IdempotencyLedger`` also carries the pace of effects that name no
provider (``DURABLE_CONCURRENCY``, ``DURABLE_RATE_LIMIT``, ``DURABLE_PROVIDER_DOWN_BUDGET_S``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from dagster import ConfigurableResource, DagsterInstance, InitResourceContext
from pydantic import Field, PrivateAttr

from durable_assets.errors import FencedOutError
from durable_assets.kit.crashpoints import CrashPoint, crash_point
from durable_assets.kit.db import DurableDatabase
from durable_assets.kit.interrupts import raise_if_stop_requested
from durable_assets.kit.leases import (
    Heartbeat,
    Lease,
    LeaseStore,
    acquire_unless_live_run,
)
from durable_assets.kit.ledger import Ledger
from durable_assets.kit.modes import ExecutorKind
from durable_assets.kit.pacing import Backoff
from durable_assets.kit.progress import Progress, ProgressReporter, ProgressStore, ShardOf, event_log_sink
from durable_assets.kit.settings import KitSettings
from durable_assets.kit.standing import raise_unless_may_send
from durable_assets.kit.step_leases import TaskContext, current_task
from durable_assets.kit.storage import StorageConfig
from durable_assets.kit.tags import BATCH_TAG, EXECUTOR_TAG, PARTITION_TAG

#: The declared defaults (no environment read here): the code location passes the environment's.
_KIT = KitSettings()


def _database(context: InitResourceContext, url: str | None) -> DurableDatabase:
    if url:
        return DurableDatabase(url)
    if context.instance is None:
        raise RuntimeError("durable-assets resources need a Dagster instance (set DAGSTER_HOME)")
    return DurableDatabase.for_instance(context.instance)


class IdempotencyLedger(ConfigurableResource):
    """Exactly-once bookkeeping (atomic phases) for any side effect; see ``durable_assets.kit.ledger``."""

    claim_ttl_seconds: float = 120.0
    provider_key_retention_hours: float = Field(
        default=_KIT.key_retention_hours,
        gt=0,
        description="Provider key retention (DURABLE_KEY_RETENTION_HOURS)",
    )
    concurrency: int = Field(
        default=_KIT.concurrency,
        ge=1,
        le=256,
        description="Concurrent effects of a step (DURABLE_CONCURRENCY)",
    )
    rate_limit_per_second: float | None = Field(
        default=_KIT.rate_limit, gt=0, description="Cap on effects/s (DURABLE_RATE_LIMIT)"
    )
    provider_down_budget_seconds: float = Field(
        default=_KIT.provider_down_budget_s, gt=0, description="Down budget (DURABLE_PROVIDER_DOWN_BUDGET_S)"
    )
    database_url: str | None = None

    _ledger: Ledger | None = PrivateAttr(default=None)

    def setup_for_execution(self, context: InitResourceContext) -> None:
        self._ledger = Ledger(_database(context, self.database_url), claim_ttl_s=self.claim_ttl_seconds)

    @property
    def ledger(self) -> Ledger:
        if self._ledger is None:
            raise RuntimeError("IdempotencyLedger used outside a run")
        return self._ledger

    @property
    def key_retention_s(self) -> float:
        return self.provider_key_retention_hours * 3600.0

    def backoff(self) -> Backoff:
        """Retry timing of effects that name no provider (a provider resource has its own)."""
        return Backoff(down_budget_s=self.provider_down_budget_seconds)


def run_ended(instance: DagsterInstance | None) -> Callable[[str], bool]:
    """Whether Dagster has recorded a run's end (for :func:`acquire_unless_live_run`)."""

    def ended(run_id: str) -> bool:
        run = instance.get_run_by_id(run_id) if instance is not None else None
        return run is not None and run.is_finished

    return ended


def _lease_of_run(leases: LeaseStore, batch_id: str, run_id: str) -> Lease:
    """The batch's lease as the orchestrator of ``run_id`` adopted it, or FencedOutError."""
    lease = leases.get(batch_id)
    if lease is None or lease.run_id != run_id:
        raise FencedOutError(
            f"batch {batch_id!r} is held by run {lease.run_id if lease else '?'}, not this task's run "
            f"{run_id}: a task of a superseded run does nothing"
        )
    return lease


class BatchRuntime(ConfigurableResource):
    """The run's lease, cancel and fence checks, and progress reporting for one batch."""

    lease_ttl_seconds: float = Field(
        default=_KIT.lease_ttl_s, gt=0, description="Lease TTL (DURABLE_LEASE_TTL_S)"
    )
    progress_interval_seconds: float = 0.5
    #: Progress into the run's event log: at most one report per this, plus each step's first and last.
    progress_event_interval_seconds: float = 1.0
    step_delay_seconds: float = Field(
        default=_KIT.step_delay_s, ge=0, description="Pause before each step (DURABLE_STEP_DELAY_S)"
    )
    database_url: str | None = None
    #: Where the batch's files go (quarantine, reports): the same place as its step outputs.
    storage: StorageConfig = Field(default_factory=StorageConfig)

    _db: DurableDatabase | None = PrivateAttr(default=None)
    _batch_id: str | None = PrivateAttr(default=None)
    _run_id: str = PrivateAttr(default="")
    _lease: Lease | None = PrivateAttr(default=None)
    _heartbeat: Heartbeat | None = PrivateAttr(default=None)
    _reporter: ProgressReporter | None = PrivateAttr(default=None)
    _task: TaskContext | None = PrivateAttr(default=None)

    def setup_for_execution(self, context: InitResourceContext) -> None:
        self._db = _database(context, self.database_url)
        run = context.dagster_run
        if run is None:
            return
        self._run_id = run.run_id
        self._batch_id = run.tags.get(BATCH_TAG) or run.tags.get(PARTITION_TAG)
        if not self._batch_id:
            return
        leases = LeaseStore(self._db, ttl_s=self.lease_ttl_s)
        if run.tags.get(EXECUTOR_TAG) == ExecutorKind.CELERY.value:
            # A step task of a distributed run: the orchestrator holds the batch's lease; this task
            # may act only while that lease is its run's (the fence it had when the task started).
            self._lease = _lease_of_run(leases, self._batch_id, run.run_id)
            self._task = current_task.get()
        else:
            # Raises LeaseHeldError when another live worker owns the batch: two workers never overlap.
            self._lease = acquire_unless_live_run(
                leases, self._batch_id, run.run_id, run_ended(context.instance)
            )
            self._heartbeat = Heartbeat(leases, self._lease).start()
        self._reporter = ProgressReporter(
            ProgressStore(self._db),
            self._batch_id,
            run.run_id,
            self.progress_interval_seconds,
            sink=event_log_sink(context.instance, run) if context.instance is not None else None,
            event_interval_s=self.progress_event_interval_seconds,
        )

    def teardown_after_execution(self, context: InitResourceContext) -> None:
        # Stop renewing but do not release: the run is not recorded as ended yet, and a released
        # lease would let a resume take over a live worker in that gap. The CLI releases after the
        # run ends; a daemon-launched worker's lease simply lapses after its TTL.
        crash_point(CrashPoint.ALL_STEPS_DONE)
        if self._heartbeat is not None:
            self._heartbeat.stop(release=False)
        if self._reporter is not None:
            self._reporter.close()

    @property
    def lease_ttl_s(self) -> float:
        return self.lease_ttl_seconds

    @property
    def step_delay_s(self) -> float:
        return self.step_delay_seconds

    @property
    def batch_id(self) -> str:
        if not self._batch_id:
            raise RuntimeError(f"this run carries no {BATCH_TAG} tag")
        return self._batch_id

    @property
    def has_batch(self) -> bool:
        """Whether this run belongs to a batch (an ad-hoc materialization of a few assets does not)."""
        return bool(self._batch_id)

    @property
    def run_id(self) -> str:
        return self._run_id

    @property
    def database(self) -> DurableDatabase | None:
        """The kit's tables of the run's instance (None outside a run)."""
        return self._db

    @property
    def fence(self) -> int:
        return self._lease.fence if self._lease else 0

    def check_may_continue(self) -> None:
        """Raise before a side effect if the batch was canceled or interrupted, or this worker was
        superseded."""
        if self._batch_id:
            raise_if_stop_requested(self._batch_id)  # one attribute read: checked first, before any query
        if self._db is None or self._lease is None:
            return
        if self._heartbeat is not None and self._heartbeat.lost.is_set():
            raise FencedOutError(f"this worker lost the lease on batch {self._batch_id!r}")
        if self._task is None:
            raise_unless_may_send(self._db, self.batch_id, self._lease.fence)
            return
        standing = raise_unless_may_send(
            self._db, self.batch_id, self._lease.fence, self._run_id, self._task.step_key
        )
        self._task.stand_down_if_superseded(standing.step_owner)

    def report(self, p: Progress, *, force: bool = False, shard: ShardOf | None = None) -> None:
        if self._reporter is not None:
            self._reporter.report(p, force=force, shard=shard)

    def expect_shards(self, step: str, rows: Sequence[int]) -> None:
        """A sharded step starts: each shard's rows stand for its count until it counts its work."""
        if self._db is not None and self._batch_id:
            ProgressStore(self._db).expect_shards(self._batch_id, self._run_id, step, rows)


def default_resources(settings: KitSettings, storage: StorageConfig | None = None) -> dict[str, Any]:
    """The kit's resources as a code location wires them: tuned by ``settings`` (its environment's),
    outputs and batch files in ``storage`` (``DURABLE_STORAGE``; default ``auto``)."""
    from durable_assets.kit.io_manager import DurableIOManager

    storage = storage or StorageConfig()
    return {
        "io_manager": DurableIOManager(storage=storage),
        "ledger": IdempotencyLedger(
            provider_key_retention_hours=settings.key_retention_hours,
            concurrency=settings.concurrency,
            rate_limit_per_second=settings.rate_limit,
            provider_down_budget_seconds=settings.provider_down_budget_s,
        ),
        "runtime": BatchRuntime(
            lease_ttl_seconds=settings.lease_ttl_s,
            step_delay_seconds=settings.step_delay_s,
            storage=storage,
        ),
    }
