"""The kit's runtime face: what the operations layer and the provider adapter build on.

A job author never imports this (they have ``durable_assets.kit``). ``ops/`` (CLI, HTTP API,
webhooks, metrics, retention, the daemon's sensors) and ``payments/`` reach the kit only through
the kit's two faces, which ``tests/test_architecture.py`` enforces; every other kit module is
private to the kit and may change under anything that is not the kit.

Why a declared face: before it, the operations layer reached into twenty kit modules and nothing
said which of them it could rely on. Here is the whole contract between the layers, grouped by
concern; changing a name here is changing that contract. Names are imported on first use, as the
author face's are (``kit/_lazy.py``), so a command that needs ``--executor``'s choices does not
pay for Dagster.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from durable_assets.kit._lazy import lazy_names

# The imports below declare the face for mypy and readers; nothing here uses them, and
# test_architecture keeps them equal to _SOURCES, the table the interpreter reads.
# ruff: noqa: F401
if TYPE_CHECKING:  # what mypy and readers see; at run time each name is imported on first use
    from durable_assets.kit.account_bindings import AccountBindings, mismatch_message
    from durable_assets.kit.accounts import DEFAULT_NAMESPACE, ProviderAccount
    from durable_assets.kit.cancel import CancelStore
    from durable_assets.kit.code_versions import (
        CodeChange,
        CodePins,
        StepCode,
        code_changes,
        effects_recorded,
        refusal,
        versions_from_metadata,
    )
    from durable_assets.kit.crashpoints import CrashPoint, arm, crash_point
    from durable_assets.kit.dagster_internals import (
        INSTALLED_DAGSTER_VERSION,
        VERIFIED_DAGSTER_VERSION,
        AssetEventTagsTable,
        ConcurrencySlotsTable,
        DynamicPartitionsTable,
        EventLogCursor,
        KnownExecutionState,
        PendingStepsTable,
        ReconstructableJob,
        RunsTable,
        RunTagsTable,
        SqlEventLogStorage,
        SqlEventLogStorageTable,
        SqlRunStorage,
        check_shard_again,
        create_execution_plan,
        is_verified_version,
        skip_shard_checks,
    )
    from durable_assets.kit.db import (
        ConnectionBounds,
        DurableDatabase,
        bound_connections,
        cancel_requests,
        dispose_engines,
        effect_subjects,
        from_row,
        hold_connections,
        idempotency,
        metadata,
        now,
        one_task_at_a_time,
        remember_existing_partitions,
        stop_requests,
        webhook_outbox,
    )
    from durable_assets.kit.decisions import ItemDecisions, all_decisions, who_decides
    from durable_assets.kit.guardrails import (
        GuardrailPin,
        PinnedGuardrails,
        guardrail_variables,
        guardrails_used,
    )
    from durable_assets.kit.interrupts import clear_stop, request_stop, stop_requested
    from durable_assets.kit.io_manager import OUTPUTS_PREFIX
    from durable_assets.kit.job import SummarySpec
    from durable_assets.kit.leases import (
        PENDING_RUN,
        Heartbeat,
        Lease,
        LeaseStore,
        acquire_unless_live_run,
        holder_is_gone,
        owner_pid,
        process_owner,
    )
    from durable_assets.kit.ledger import FINISHED, REVIEW, STARTED, Ledger
    from durable_assets.kit.modes import DEFAULT_SHARDS, MAX_SHARDS, ExecutorKind
    from durable_assets.kit.pacing import Backoff, ListCursors, RateLimiter, account_limiter
    from durable_assets.kit.progress import Progress, ProgressStore, progress_from_event
    from durable_assets.kit.resources import run_ended
    from durable_assets.kit.settings import (
        DEFAULT_LEASE_TTL_S,
        CrashHooks,
        DistributedSettings,
        KitSettings,
        StorageSettings,
    )
    from durable_assets.kit.shard_names import step_of_shard
    from durable_assets.kit.sharding import UNTAGGED_SCHEME
    from durable_assets.kit.storage import (
        S3_SCHEME,
        BatchKeys,
        BatchStorage,
        LocalStorage,
        Purged,
        S3Storage,
        StorageConfig,
        StorageKind,
        batch_storage,
        read_uri,
    )
    from durable_assets.kit.tags import (
        AUTO_RESUME_ATTEMPT_TAG,
        AUTO_RESUME_MAX_TAG,
        AUTO_RESUME_OF_TAG,
        AUTO_RESUMED_BY_TAG,
        AUTO_RETRY_RUN_ID_TAG,
        BATCH_TAG,
        CANCELED_KEY,
        CODE_VERSIONS_KEY,
        EXECUTOR_TAG,
        FAILURE_REASON_TAG,
        FILES_KEY,
        GUARDRAIL_VARIABLES_KEY,
        HELD_FOR_REVIEW_KEY,
        INPUT_DATA_VERSION_TAG_PREFIX,
        MAX_RETRIES_TAG,
        PARENT_RUN_ID_TAG,
        PARTITION_TAG,
        RESUME_RETRY_TAG,
        RETRY_NUMBER_TAG,
        ROOT_RUN_ID_TAG,
        RUN_METRICS_TAG,
        SHARD_SCHEME_TAG,
        SHARDS_TAG,
        STEPS_KEY,
        WILL_RETRY_TAG,
        WORKER_LOST_CANCELED,
        WORKER_LOST_LEASE_EXPIRED,
        WORKER_LOST_TAG,
        worker_lost_reason,
    )
    from durable_assets.kit.worker import run_worker

#: Where each name of the runtime face lives (kept equal to the imports above by test_architecture).
_SOURCES: dict[str, tuple[str, ...]] = {
    # Settings and modes: what an instance and a command are configured with.
    "durable_assets.kit.settings": (
        "CrashHooks",
        "DEFAULT_LEASE_TTL_S",
        "DistributedSettings",
        "KitSettings",
        "StorageSettings",
    ),
    "durable_assets.kit.modes": (
        "DEFAULT_SHARDS",
        "ExecutorKind",
        "MAX_SHARDS",
    ),
    # What a job declares that only the operations layer reads.
    "durable_assets.kit.job": ("SummarySpec",),
    # The kit's database: its tables, connections and clock.
    "durable_assets.kit.db": (
        "ConnectionBounds",
        "DurableDatabase",
        "bound_connections",
        "cancel_requests",
        "dispose_engines",
        "effect_subjects",
        "from_row",
        "hold_connections",
        "idempotency",
        "metadata",
        "now",
        "one_task_at_a_time",
        "remember_existing_partitions",
        "stop_requests",
        "webhook_outbox",
    ),
    # Run leases, cancel and stop requests: who runs a batch, and how it is told to stop.
    "durable_assets.kit.leases": (
        "Heartbeat",
        "Lease",
        "LeaseStore",
        "PENDING_RUN",
        "acquire_unless_live_run",
        "holder_is_gone",
        "owner_pid",
        "process_owner",
    ),
    "durable_assets.kit.cancel": ("CancelStore",),
    "durable_assets.kit.interrupts": (
        "clear_stop",
        "request_stop",
        "stop_requested",
    ),
    # The ledger of effects and what a batch reports as it runs.
    "durable_assets.kit.ledger": (
        "FINISHED",
        "Ledger",
        "REVIEW",
        "STARTED",
    ),
    "durable_assets.kit.progress": (
        "Progress",
        "ProgressStore",
        "progress_from_event",
    ),
    "durable_assets.kit.resources": ("run_ended",),
    # Run tags and metadata keys, and the shards of a sharded step.
    "durable_assets.kit.tags": (
        "AUTO_RESUMED_BY_TAG",
        "AUTO_RESUME_ATTEMPT_TAG",
        "AUTO_RESUME_MAX_TAG",
        "AUTO_RESUME_OF_TAG",
        "AUTO_RETRY_RUN_ID_TAG",
        "BATCH_TAG",
        "CANCELED_KEY",
        "CODE_VERSIONS_KEY",
        "EXECUTOR_TAG",
        "FAILURE_REASON_TAG",
        "FILES_KEY",
        "GUARDRAIL_VARIABLES_KEY",
        "HELD_FOR_REVIEW_KEY",
        "INPUT_DATA_VERSION_TAG_PREFIX",
        "MAX_RETRIES_TAG",
        "PARENT_RUN_ID_TAG",
        "PARTITION_TAG",
        "RESUME_RETRY_TAG",
        "RETRY_NUMBER_TAG",
        "ROOT_RUN_ID_TAG",
        "RUN_METRICS_TAG",
        "SHARD_SCHEME_TAG",
        "SHARDS_TAG",
        "STEPS_KEY",
        "WILL_RETRY_TAG",
        "WORKER_LOST_CANCELED",
        "WORKER_LOST_LEASE_EXPIRED",
        "WORKER_LOST_TAG",
        "worker_lost_reason",
    ),
    "durable_assets.kit.shard_names": ("step_of_shard",),
    "durable_assets.kit.sharding": ("UNTAGGED_SCHEME",),
    # Deploys: the code a batch ran with, and the guardrails pinned with it.
    "durable_assets.kit.code_versions": (
        "CodeChange",
        "CodePins",
        "StepCode",
        "code_changes",
        "effects_recorded",
        "refusal",
        "versions_from_metadata",
    ),
    "durable_assets.kit.guardrails": (
        "GuardrailPin",
        "PinnedGuardrails",
        "guardrail_variables",
        "guardrails_used",
    ),
    # A person's decisions on held items.
    "durable_assets.kit.decisions": (
        "ItemDecisions",
        "all_decisions",
        "who_decides",
    ),
    # Provider accounts and their pace.
    "durable_assets.kit.accounts": (
        "DEFAULT_NAMESPACE",
        "ProviderAccount",
    ),
    "durable_assets.kit.account_bindings": (
        "AccountBindings",
        "mismatch_message",
    ),
    "durable_assets.kit.pacing": (
        "Backoff",
        "ListCursors",
        "RateLimiter",
        "account_limiter",
    ),
    # Where a batch's files and outputs live.
    "durable_assets.kit.storage": (
        "BatchKeys",
        "BatchStorage",
        "LocalStorage",
        "Purged",
        "S3Storage",
        "S3_SCHEME",
        "StorageConfig",
        "StorageKind",
        "batch_storage",
        "read_uri",
    ),
    "durable_assets.kit.io_manager": ("OUTPUTS_PREFIX",),
    # Processes: the Celery worker and the crash points the crash tests arm.
    "durable_assets.kit.worker": ("run_worker",),
    "durable_assets.kit.crashpoints": (
        "CrashPoint",
        "arm",
        "crash_point",
    ),
    # Dagster's own storage, in the one module that may touch its internals.
    "durable_assets.kit.dagster_internals": (
        "AssetEventTagsTable",
        "ConcurrencySlotsTable",
        "DynamicPartitionsTable",
        "EventLogCursor",
        "INSTALLED_DAGSTER_VERSION",
        "KnownExecutionState",
        "PendingStepsTable",
        "ReconstructableJob",
        "RunTagsTable",
        "RunsTable",
        "SqlEventLogStorage",
        "SqlEventLogStorageTable",
        "SqlRunStorage",
        "VERIFIED_DAGSTER_VERSION",
        "check_shard_again",
        "create_execution_plan",
        "is_verified_version",
        "skip_shard_checks",
    ),
}

__all__, __getattr__, __dir__ = lazy_names(__name__, _SOURCES)
