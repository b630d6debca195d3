"""One exception hierarchy for durable-assets.

Every condition a user or operator can act on has its own class, so callers (the CLI, the HTTP API,
Dagster's retry policy) can decide by type rather than by parsing messages. Messages say what
happened and what to do next, naming what the user changes (an option, a ``DURABLE_*`` variable, a
file and line), never a Python class or field.
"""

from __future__ import annotations


class DurableError(Exception):
    """Base of every error raised by durable-assets on purpose."""

    #: Process exit code the CLI uses when this error ends a command (see docs/contract.md).
    exit_code: int = 1


# --- usage and input ---------------------------------------------------------------------------


class UsageError(DurableError):
    """The command line or a request was malformed (exit 2)."""

    exit_code = 2


class InvalidBatchIdError(UsageError):
    """A batch ID does not match ``[A-Za-z0-9][A-Za-z0-9_.-]{0,63}``."""


class UnknownJobError(UsageError):
    """``--job`` names no registered durable job."""


class InputFileError(UsageError):
    """An input file could not be read, or lacks required columns."""


# --- batches -------------------------------------------------------------------------------------


class BatchConflictError(DurableError):
    """The batch is in a state that forbids the request (exit 3)."""

    exit_code = 3


class BatchExistsError(BatchConflictError):
    """``job run`` of a batch ID that already has runs."""


class UnknownBatchError(BatchConflictError):
    """No run carries this batch ID."""


class LeaseHeldError(BatchConflictError):
    """A live worker still holds the batch's lease, so it may not be resumed or taken over."""


class DatabaseLockedError(BatchConflictError):
    """Another process has held a SQLite file of the instance write-locked for longer than any
    healthy writer does (a frozen or stuck worker): waiting on it would hang, so the command stops."""


# --- idempotency and side effects ---------------------------------------------------------------


class IdempotencyError(DurableError):
    """Base for violations of idempotency-key semantics."""


class IdempotencyKeyMismatchError(IdempotencyError):
    """The same key was used with different parameters; nothing was overwritten."""


class IdempotencyKeyEndpointError(IdempotencyKeyMismatchError):
    """The key was first used on another endpoint (Stripe binds a key to its first one); nothing was
    changed. A mismatch too: whoever stops on a mismatch stops on this."""


class IdempotencyKeyInFlightError(IdempotencyError):
    """Another request with the same key is still being processed; retry later with the same key."""


class KeyDriftError(IdempotencyError):
    """A resumed step derives another key or subject for an item than the ledger recorded for it in
    this batch (the code that derives keys changed): sending under the new key would act twice, so
    the step stops before its first request, whatever ``--accept-code-change`` says."""


class FencedOutError(DurableError):
    """A newer run of the batch has taken over; this (orphaned) worker must not send requests."""


class BatchCanceledError(DurableError):
    """A cancel was recorded for the batch; the step stopped before its next side effect."""


class BatchInterruptedError(DurableError):
    """The process running the batch got SIGINT or SIGTERM and stopped at a safe point.

    Its exit code is the shell's for that signal (130 for Ctrl-C, 143 for SIGTERM), so a script
    sees an interrupt, not a failed batch; `job resume` continues it.
    """

    def __init__(self, message: str, *, signum: int) -> None:
        super().__init__(message)
        self.signum = signum
        self.exit_code = 128 + signum


class CodeChangedError(UsageError):
    """The deployed code of a step differs from the code its batch started with, in a step that has
    recorded effects (or whose declared ``code_version`` changed): a resume is refused before any
    step runs (exit 2) until the old code is back or a person accepts the change."""


class UnknownShardSchemeError(DurableError):
    """A batch was started by a newer release, which split its shards in a way this one does not
    know: resume it with that release."""


class StoredOutputIncompatibleError(DurableError):
    """A step's stored output, written by the code the batch started with, does not load on the code
    deployed now (a class that moved, a module that is gone): resume on the batch's own code."""


class GuardrailError(DurableError):
    """A safety limit would be crossed (refund above refundable amount, batch ceiling)."""


# --- payment provider ---------------------------------------------------------------------------


class ProviderError(DurableError):
    """Base for failures reported by (or while talking to) the payment provider."""

    def __init__(
        self,
        message: str,
        *,
        http_status: int | None = None,
        code: str | None = None,
        retry_after: float | None = None,
    ) -> None:
        super().__init__(message)
        self.http_status = http_status
        self.code = code
        self.retry_after = retry_after


class TransientProviderError(ProviderError):
    """A fault worth retrying with the same idempotency key: 429, 5xx, timeout, lost connection."""


class ProviderRejectedError(ProviderError):
    """The provider refused the request (4xx other than 409/429); retrying will not help."""


class ProviderUnavailableError(ProviderError):
    """The provider let nothing through for the whole down budget. Not transient: the step's retry
    policy must not wait the budget again; ``job resume`` continues once the provider is back."""


class ProviderResponseMismatchError(ProviderError):
    """The provider's answer does not match what was asked (amount, currency, charge): fail closed."""


class ProviderConfigError(UsageError):
    """The configured provider cannot be used as configured (a missing or refused API key, an
    unreachable URL), found before a batch exists (exit 2)."""


class ProviderAccountMismatchError(UsageError):
    """A batch bound to one provider account was asked to continue against another (exit 2): its
    ledger entries and provider IDs belong to the first account, so it must not start over elsewhere."""


# --- webhooks -------------------------------------------------------------------------------------


class WebhookConfigError(UsageError):
    """``DURABLE_WEBHOOK_URLS`` / ``DURABLE_WEBHOOK_SECRET`` are set but unusable (exit 2)."""


class WebhookVerificationError(DurableError):
    """A received webhook's headers or signature do not verify: the receiver must reject it."""


# --- retention -----------------------------------------------------------------------------------


class PruneInProgressError(BatchConflictError):
    """Another prune holds the archive directory's lock (exit 3)."""


class ArchiveError(DurableError):
    """An archive could not be written, or one on disk disagrees with run storage; nothing was deleted."""


class StorageError(DurableError):
    """Shared storage (the database's ``durable_blobs``, an S3 bucket) could not store or give back a
    batch's output, file or input; the message names the URI and the store's answer."""


# --- the code location and the instance ----------------------------------------------------------


class StepWiringError(UsageError):
    """A durable step cannot get what it needs (its ``runtime`` or ``ledger`` resource, its effect
    scope): found when the job is defined, so it never runs without cancel, fence or ledger (exit 2)."""


class UnsetVariableError(UsageError):
    """A resource of the code location is configured from an environment variable (``EnvVar``) that
    this process does not have: named in one line before any step runs (exit 2)."""


class InstanceConfigError(UsageError):
    """The Dagster instance's ``dagster.yaml`` lacks the lease-aware launcher, run monitoring or run
    retries, without which a dead worker's batch is never failed nor resumed by the daemon (exit 2)."""


class InstanceContradictionError(InstanceConfigError):
    """What this shell or command asks for contradicts the instance's ``dagster.yaml``: Dagster would
    quietly follow the file (a SQLite folder while ``DAGSTER_PG_URL`` names a database, workers that
    cannot reach a SQLite file), so the batch would live where nobody looks for it (exit 2)."""


class PostgresUrlContradictionError(InstanceContradictionError):
    """``DAGSTER_PG_URL`` is set, but the instance's ``dagster.yaml`` stores on SQLite, or in another
    Postgres database than the one it names."""


class ExecutorContradictionError(InstanceContradictionError):
    """The distributed executor (``--executor celery``, ``job worker``, a batch that ran on the
    workers, ``DURABLE_SCHEDULE_EXECUTOR=celery``) on an instance that stores on SQLite, which the
    workers of other hosts cannot share."""


class InstanceFolderExistsError(UsageError):
    """``job init-home DIR`` would replace a ``dagster.yaml`` that says something else: the folder may
    be someone's live instance, so it is changed only with ``--force`` (exit 2)."""


# --- the machine -----------------------------------------------------------------------------------


class DiskFullError(DurableError):
    """The filesystem holding the instance (SQLite storage, our tables, step outputs, the batch log)
    has no space left. Nothing is lost: every committed step and side effect stays recorded, and
    ``job resume`` continues once space is freed (exit 1, as for any batch that ended failed)."""

    def __init__(self, message: str, *, path: str) -> None:
        super().__init__(message)
        self.path = path
