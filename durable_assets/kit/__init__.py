"""The durability kit: what makes a Dagster asset job durable. Import from here; the rest is private.

- Describe the job: :class:`DurableJob` (steps, partitions, input config, summary) registered in
  the code location's :class:`DurableJobs`; :func:`durable_asset` for each step.
- Inside steps: :func:`effect_runner` sends each :class:`Intent` exactly once through the
  :class:`IdempotencyLedger`; :class:`BatchRuntime` holds the lease, checks cancel and fence, and
  reports progress; :func:`frame_result` returns a frame with its row count and data version.
- Inputs: :func:`read_text_table` reads a CSV or Parquet file as text (a malformed file is an
  :class:`InputFileError`); :class:`RowChecks` collects every reason a row is quarantined.
- Guardrails: subclass :class:`Guardrails` for a batch's ceilings and limits; their values are
  pinned with the batch at its first run and every later run of it uses them.
- Run tags and metadata keys (all in ``kit/tags.py``): every run of a batch carries
  :data:`BATCH_TAG`; a step reports the items it left for a person as :data:`HELD_FOR_REVIEW_KEY`
  in its materialization metadata (``job status`` shows the batch as needing review).
- Errors: one hierarchy under :class:`DurableError`; raise :class:`TransientProviderError` for a
  fault worth retrying with the same key, :class:`ProviderRejectedError` for one that is not.

``docs/your-own-job.md`` walks through a whole job.
"""

from durable_assets.kit.account_bindings import AccountBindings
from durable_assets.kit.accounts import ProviderAccount
from durable_assets.kit.effects import EffectReport, EffectRunner, review_note
from durable_assets.kit.errors import (
    DurableError,
    GuardrailError,
    InputFileError,
    ProviderAccountMismatchError,
    ProviderConfigError,
    ProviderRejectedError,
    ProviderResponseMismatchError,
    TransientProviderError,
    UsageError,
)
from durable_assets.kit.frames import typed, write_csv_atomically
from durable_assets.kit.guardrails import Guardrails
from durable_assets.kit.job import (
    DurableJob,
    DurableJobs,
    DurableStep,
    SummaryLine,
    SummarySpec,
    path_and_size,
)
from durable_assets.kit.ledger import Intent, LedgerEntry
from durable_assets.kit.pacing import Backoff, RateLimiter, call_with_retries, paced_map, shared_limiter
from durable_assets.kit.progress import Progress
from durable_assets.kit.resources import BatchRuntime, IdempotencyLedger
from durable_assets.kit.schedules import DailyBatches
from durable_assets.kit.steps import (
    TRANSIENT_RETRY,
    batch_dir,
    durable_asset,
    durable_step,
    effect_runner,
    frame_result,
    step_progress,
)
from durable_assets.kit.tables import (
    EMAIL_PATTERN,
    REASONS,
    ROW_NUMBER,
    RowChecks,
    as_mask,
    bad_encoding,
    clean_strings,
    read_text_table,
    reason_counts,
)
from durable_assets.kit.tags import BATCH_TAG, HELD_FOR_REVIEW_KEY

__all__ = [
    "BATCH_TAG",
    "EMAIL_PATTERN",
    "HELD_FOR_REVIEW_KEY",
    "REASONS",
    "ROW_NUMBER",
    "TRANSIENT_RETRY",
    "AccountBindings",
    "Backoff",
    "BatchRuntime",
    "DailyBatches",
    "DurableError",
    "DurableJob",
    "DurableJobs",
    "DurableStep",
    "EffectReport",
    "EffectRunner",
    "GuardrailError",
    "Guardrails",
    "IdempotencyLedger",
    "InputFileError",
    "Intent",
    "LedgerEntry",
    "Progress",
    "ProviderAccount",
    "ProviderAccountMismatchError",
    "ProviderConfigError",
    "ProviderRejectedError",
    "ProviderResponseMismatchError",
    "RateLimiter",
    "RowChecks",
    "SummaryLine",
    "SummarySpec",
    "TransientProviderError",
    "UsageError",
    "as_mask",
    "bad_encoding",
    "batch_dir",
    "call_with_retries",
    "clean_strings",
    "durable_asset",
    "durable_step",
    "effect_runner",
    "frame_result",
    "paced_map",
    "path_and_size",
    "read_text_table",
    "reason_counts",
    "review_note",
    "shared_limiter",
    "step_progress",
    "typed",
    "write_csv_atomically",
]
