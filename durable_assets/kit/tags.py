"""Every run tag and metadata key that crosses a module or a layer, spelled once.

Why one module: these strings are the contract between whoever writes a tag or a metadata entry
and whoever reads it, often in another layer (the kit writes ``durable/worker_lost``, the
operations layer reads it; a pipeline writes ``held_for_review``, the status reads it). Spelled in
each module, a typo compares unequal in silence and a rename misses a reader. Here each one is a
name, and each group says who writes it and who reads it. Plain strings (``Final``), not enum
members: they go into Dagster's run storage and serialised events, which want ``str`` exactly.

This module imports nothing of ours, so any module (a leaf one included) can import it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Final

# --- Our run tags --------------------------------------------------------------------------------
# Written on Dagster runs by the kit (launcher, schedules, job) and the operations layer (runner,
# re-execution, auto-resume); read by both and by the provider adapter. docs/contract.md names
# ``durable/batch``: users filter the Dagster UI with it.

#: The batch a run belongs to: every run of a batch's lineage carries it. Written by the CLI and
#: API runner (ops/reexecution.py), the kit's schedules and the run launcher (copied from the
#: partition of a run started in the UI); read everywhere a run is mapped to its batch.
BATCH_TAG: Final = "durable/batch"
#: How the run executes (``modes.ExecutorKind``): written by ops/runner.py and kit/job.py; read by
#: the batch runtime, the provider adapter, the registry and auto-resume.
EXECUTOR_TAG: Final = "durable/executor"
#: How many shards a distributed run splits its mutating step into; written with ``EXECUTOR_TAG``.
SHARDS_TAG: Final = "durable/shards"
#: How a distributed run's shard steps split their rows (``sharding.ShardScheme``): written with
#: ``SHARDS_TAG`` (kit/job.py); read by every shard step from its lineage's *first* run, so the
#: shards of one batch split alike across a deploy. A first run without it split by CRC-32.
SHARD_SCHEME_TAG: Final = "durable/shard_scheme"
#: The run's worker was lost (its lease lapsed). Written by the run launcher's monitor and by
#: ops/runner.py (takeover, cancel); read by ops/status.py, metrics and auto-resume. Its values are
#: the ``WORKER_LOST_*`` names below.
WORKER_LOST_TAG: Final = "durable/worker_lost"
#: Written by ops/auto_resume.py on the run it submits: which attempt it is, of how many, and the
#: lost run it continues. Read by ops/status.py (the status JSON's ``auto_resume``).
AUTO_RESUME_ATTEMPT_TAG: Final = "durable/auto_resume_attempt"
AUTO_RESUME_MAX_TAG: Final = "durable/auto_resume_max_attempts"
AUTO_RESUME_OF_TAG: Final = "durable/auto_resume_of"
#: Written by ops/auto_resume.py on the lost run: the run that resumed it, or why none did. Read by
#: auto-resume itself, so a lost run is resumed once.
AUTO_RESUMED_BY_TAG: Final = "durable/auto_resumed_by"

# Values of WORKER_LOST_TAG.
#: The worker's lease lapsed while the run looked alive (run monitor, `job resume`'s takeover).
WORKER_LOST_LEASE_EXPIRED: Final = "lease_expired"
#: `job cancel` ended the run because its worker was lost; the status still reads as a lost worker.
WORKER_LOST_CANCELED: Final = "canceled_after_lease_expired"
#: Not lost: Dagster's run retry copies its parent's tags, ours included, and offers no way to
#: remove one, so the run launcher overwrites an inherited verdict with this before the run starts.
WORKER_NOT_LOST: Final = ""


def worker_lost_reason(tags: Mapping[str, str]) -> str | None:
    """Why the run's worker was lost (a ``WORKER_LOST_*`` value), or None: it was not."""
    return tags.get(WORKER_LOST_TAG) or None


# --- Dagster's run tags ---------------------------------------------------------------------------
# Dagster's own tags, read and written by the kit and the operations layer. Spelled out here because
# their constants live in a private module of Dagster (its storage tags), not public API; if Dagster
# renames one, this is the one place to change (kit/dagster_internals.py's contract tests compare).

#: The partition of a partitioned run: written by ops/reexecution.py (so the UI shows the batch as a
#: partition) and by Dagster for a partition launched in the UI; read by the launcher, the runtime
#: and the schedules as the batch ID of a run that lacks ``BATCH_TAG``.
PARTITION_TAG: Final = "dagster/partition"
#: A re-execution's lineage: written by ops/reexecution.py; read by auto-resume.
PARENT_RUN_ID_TAG: Final = "dagster/parent_run_id"
ROOT_RUN_ID_TAG: Final = "dagster/root_run_id"
RESUME_RETRY_TAG: Final = "dagster/is_resume_retry"
#: Dagster's run retries: ops/runner.py and ops/interrupts.py set it to 0 on a run they end.
MAX_RETRIES_TAG: Final = "dagster/max_retries"
#: Dagster's run-retry daemon's link from a failed run to its retry; auto-resume writes it too, so
#: the daemon does not retry a run auto-resume already resumed.
AUTO_RETRY_RUN_ID_TAG: Final = "dagster/auto_retry_run_id"
#: Dagster's run-retry bookkeeping on a failed run: auto-resume does not carry these to a resume.
WILL_RETRY_TAG: Final = "dagster/will_retry"
RETRY_NUMBER_TAG: Final = "dagster/retry_number"
FAILURE_REASON_TAG: Final = "dagster/failure_reason"
#: Run metrics Dagster records on a run; not carried to a resume.
RUN_METRICS_TAG: Final = ".dagster/run_metrics"
#: Prefix of a materialization's tags naming the data version of each input; ops/status.py hashes
#: them into a step's ``input_hash``.
INPUT_DATA_VERSION_TAG_PREFIX: Final = "dagster/input_data_version/"

# --- Definition metadata --------------------------------------------------------------------------
# Written by the kit on asset and job definitions; read by the kit (step numbering, `job jobs`) and
# the operations layer through the registry.

#: The step's user-facing label (``durable_asset(label=...)``).
LABEL_KEY: Final = "durable/label"
#: The ledger scope of the step's side effects; empty when it causes none.
EFFECT_SCOPE_KEY: Final = "durable/effect_scope"
#: The job's steps in order, as ``[key, label]`` pairs: how a running step knows its number.
STEPS_KEY: Final = "durable/steps"
#: The job's files for people (``SummarySpec.files``), as ``[label, step, metadata key]`` triples:
#: how a status names a batch's files without importing the code location.
FILES_KEY: Final = "durable/files"
#: The job's guardrails as ``{guardrail name: {field: environment variable}}``: how a status names
#: a pinned value by the variable that sets it without importing the code location.
GUARDRAIL_VARIABLES_KEY: Final = "durable/guardrail_variables"
#: The code version of each step as deployed when the job was defined, ``{step: {"version": ...,
#: "declared": bool}}`` (kit/code_versions.py): what a running step compares with the batch's pin,
#: and what a status shows without importing the code location.
CODE_VERSIONS_KEY: Final = "durable/code_versions"
#: On a shard asset: the step it is a part of.
SHARD_OF_KEY: Final = "durable/shard_of"

# --- Event metadata -------------------------------------------------------------------------------
# Metadata on the events of a run's log that a reader in another layer interprets.

#: Materialization metadata by which a pipeline's step says how many of the batch's items it left
#: for a person. Written by the pipelines' steps; read by ops/status.py (``held_for_review`` and
#: ``needs_review`` of the status JSON), metrics and the end-of-batch summary. The batch's figure is
#: that of the last step, in step order, that reports it.
HELD_FOR_REVIEW_KEY: Final = "held_for_review"
#: Materialization metadata: the row count of a step's output frame. Written by kit/steps.py
#: (``frame_result``) and kit/sharding.py (a merged step: the sum of its shards'); read by the
#: pipelines' end-of-batch summaries (kit/summaries.py).
ROWS_KEY: Final = "rows"
#: Engine-event metadata that marks the event as a progress report. Written by kit/progress.py;
#: read by it for the event stream of ops/events.py.
PROGRESS_METADATA_KEY: Final = "durable/progress"
#: Step-failure metadata (``True``) marking a step stopped because its batch was canceled, not one
#: that failed. Written by the kit's durable step when it stops on a cancel; read by ops/status.py,
#: which shows such a step as skipped (resume runs it).
CANCELED_KEY: Final = "durable/canceled"
