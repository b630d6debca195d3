"""The durability kit: what makes a Dagster asset job durable. Import from here; the rest is private.

- Describe the job: :class:`DurableJob` (steps, partitions, input config, summary) registered in
  the code location's :class:`DurableJobs`; :func:`durable_asset` for each step.
- Inside steps: :func:`effect_runner` sends each :class:`Intent` exactly once through the
  :class:`IdempotencyLedger`; :class:`BatchRuntime` holds the lease, checks cancel and fence, and
  reports progress; :func:`frame_result` returns a frame with its row count and data version.
- Errors: one hierarchy under :class:`DurableError`; raise :class:`TransientProviderError` for a
  fault worth retrying with the same key, :class:`ProviderRejectedError` for one that is not.

``docs/your-own-job.md`` walks through a whole job.
"""

from durable_assets.kit.effects import EffectReport, EffectRunner
from durable_assets.kit.errors import (
    DurableError,
    GuardrailError,
    InputFileError,
    ProviderRejectedError,
    ProviderResponseMismatchError,
    TransientProviderError,
    UsageError,
)
from durable_assets.kit.frames import typed, write_csv_atomically
from durable_assets.kit.job import (
    DurableJob,
    DurableJobs,
    DurableStep,
    SummaryLine,
    SummarySpec,
    path_and_size,
)
from durable_assets.kit.ledger import Intent, LedgerEntry
from durable_assets.kit.pacing import Backoff, RateLimiter, call_with_retries, shared_limiter
from durable_assets.kit.progress import Progress
from durable_assets.kit.resources import BATCH_TAG, BatchRuntime, IdempotencyLedger
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

__all__ = [
    "BATCH_TAG",
    "TRANSIENT_RETRY",
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
    "IdempotencyLedger",
    "InputFileError",
    "Intent",
    "LedgerEntry",
    "Progress",
    "ProviderRejectedError",
    "ProviderResponseMismatchError",
    "RateLimiter",
    "SummaryLine",
    "SummarySpec",
    "TransientProviderError",
    "UsageError",
    "batch_dir",
    "call_with_retries",
    "durable_asset",
    "durable_step",
    "effect_runner",
    "frame_result",
    "path_and_size",
    "shared_limiter",
    "step_progress",
    "typed",
    "write_csv_atomically",
]
