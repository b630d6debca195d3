"""The durability kit: what makes a Dagster asset job durable. Import from here; the rest is private.

- Describe the job: :class:`DurableJob` (steps, partitions, input config, summary) registered in
  the code location's :class:`DurableJobs`; :func:`durable_asset` for each step.
- Inside steps: :func:`effect_runner` sends each :class:`Intent` exactly once through the
  :class:`IdempotencyLedger`; :class:`BatchRuntime` holds the lease, checks cancel and fence, and
  reports progress; :func:`frame_result` returns a frame with its row count and data version.
- Inputs: :func:`read_text_table` reads a CSV or Parquet file as text (a malformed file is an
  :class:`InputFileError`) and :func:`text_columns` cleans a frame's columns once; :class:`RowChecks`
  collects every reason a row is quarantined and keeps the rest (:meth:`RowChecks.valid_rows`,
  :class:`Validated`); :func:`write_quarantine` and :func:`write_report` write the batch's files for
  people, :func:`quarantine_line`, :func:`quarantine_file` and :func:`report_file` point the summary
  at them; :func:`batch_summary_spec`, :func:`rows_line` and :func:`held_for_review_line` build
  the usual summary around them.
- Effects at a provider: ``effect_runner(..., provider=resource)`` takes its pace and account from a
  :class:`PacedProvider`; :func:`answer_mismatches` and ``review_note(subject_taken=...)`` word
  what is held for review. Outcome checks: :func:`batch_check`, :func:`check_result`.
- Guardrails: subclass :class:`Guardrails` for a batch's ceilings and limits; their values are
  pinned with the batch at its first run and every later run of it uses them.
- Run tags and metadata keys (all in ``kit/tags.py``): every run of a batch carries
  :data:`BATCH_TAG`; a step reports the items it left for a person as :data:`HELD_FOR_REVIEW_KEY`
  in its materialization metadata (``job status`` shows the batch as needing review).
- A person's word on a held item: a job declares the decisions it honours
  (``DurableJob(decisions=...)``), ``job decide`` records one, and a step reads those in force with
  :func:`decisions_for` (each an :class:`ItemDecision`) before it holds or moves that item again.
- Tables of your own: :class:`Migrations` versions them with Alembic (your revisions, your version
  table), as the kit versions its own; :func:`enable_wal` switches a SQLite file of your own to
  WAL even while other processes are opening it.
- Errors: one hierarchy under :class:`DurableError`; raise :class:`TransientProviderError` for a
  fault worth retrying with the same key, :class:`ProviderRejectedError` for one that is not.

``docs/your-own-job.md`` walks through a whole job.
"""

from __future__ import annotations

import ast
import functools
import importlib
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # what mypy and readers see; at run time each name is imported on first use
    from durable_assets.errors import (
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
    from durable_assets.kit.account_bindings import AccountBindings
    from durable_assets.kit.accounts import ProviderAccount
    from durable_assets.kit.batch_files import (
        quarantine_file,
        quarantine_line,
        report_file,
        write_quarantine,
        write_report,
    )
    from durable_assets.kit.checks import batch_check, check_examples, check_result
    from durable_assets.kit.decisions import ItemDecision, decisions_for
    from durable_assets.kit.effects import EffectReport, EffectRunner, answer_mismatches, review_note
    from durable_assets.kit.frames import (
        BOOL,
        INT64,
        TEXT,
        UTC_TIMESTAMP,
        text_dtypes,
        typed,
        write_csv_atomically,
    )
    from durable_assets.kit.guardrails import Guardrails, amount_ceiling, count_ceiling
    from durable_assets.kit.job import (
        BatchInput,
        DurableJob,
        DurableJobs,
        DurableStep,
        SummaryLine,
        SummarySpec,
        path_and_size,
    )
    from durable_assets.kit.ledger import Intent, LedgerEntry
    from durable_assets.kit.pacing import (
        Backoff,
        PacedProvider,
        RateLimiter,
        call_with_retries,
        paced_map,
        shared_limiter,
    )
    from durable_assets.kit.progress import Progress
    from durable_assets.kit.resources import BatchRuntime, IdempotencyLedger
    from durable_assets.kit.schedules import DailyBatches
    from durable_assets.kit.schema_migrations import Migrations
    from durable_assets.kit.sqlite_wal import enable_wal
    from durable_assets.kit.steps import (
        TRANSIENT_RETRY,
        batch_dir,
        batch_input,
        batch_storage_of,
        durable_asset,
        durable_step,
        effect_runner,
        frame_result,
        report_progress,
    )
    from durable_assets.kit.summaries import batch_summary_spec, held_for_review_line, rows_line
    from durable_assets.kit.tables import (
        EMAIL_PATTERN,
        REASONS,
        ROW_NUMBER,
        RowChecks,
        Validated,
        as_mask,
        bad_encoding,
        clean_strings,
        read_text_table,
        reason_counts,
        require_columns,
        text_columns,
    )
    from durable_assets.kit.tags import BATCH_TAG, HELD_FOR_REVIEW_KEY


@functools.cache
def _sources() -> dict[str, str]:
    """Which module each public name comes from, read from the ``TYPE_CHECKING`` imports above.

    Importing the kit costs nothing until a name is used, so a process that needs one small module
    (the CLI's ``kit.modes`` for ``--executor``) does not pay for Dagster and pandas (issue #25: a
    usage error answers at once). The imports above stay the one list of where names live, for
    mypy, for readers and for this table, as scientific Python's SPEC 1 (``lazy_loader``) does
    with a stub file.
    """
    tree = ast.parse(Path(__file__).read_text(encoding="utf-8"))
    guard = next(n for n in tree.body if isinstance(n, ast.If) and ast.unparse(n.test) == "TYPE_CHECKING")
    return {
        alias.name: node.module
        for node in guard.body
        if isinstance(node, ast.ImportFrom) and node.module
        for alias in node.names
    }


def __getattr__(name: str) -> Any:
    module = _sources().get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # the next lookup is an ordinary attribute read
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})


__all__ = [
    "BATCH_TAG",
    "BOOL",
    "EMAIL_PATTERN",
    "HELD_FOR_REVIEW_KEY",
    "INT64",
    "REASONS",
    "ROW_NUMBER",
    "TEXT",
    "TRANSIENT_RETRY",
    "UTC_TIMESTAMP",
    "AccountBindings",
    "Backoff",
    "BatchInput",
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
    "ItemDecision",
    "LedgerEntry",
    "Migrations",
    "PacedProvider",
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
    "Validated",
    "amount_ceiling",
    "answer_mismatches",
    "as_mask",
    "bad_encoding",
    "batch_check",
    "batch_dir",
    "batch_input",
    "batch_storage_of",
    "batch_summary_spec",
    "call_with_retries",
    "check_examples",
    "check_result",
    "clean_strings",
    "count_ceiling",
    "decisions_for",
    "durable_asset",
    "durable_step",
    "effect_runner",
    "enable_wal",
    "frame_result",
    "held_for_review_line",
    "paced_map",
    "path_and_size",
    "quarantine_file",
    "quarantine_line",
    "read_text_table",
    "reason_counts",
    "report_file",
    "report_progress",
    "require_columns",
    "review_note",
    "rows_line",
    "shared_limiter",
    "text_columns",
    "text_dtypes",
    "typed",
    "write_csv_atomically",
    "write_quarantine",
    "write_report",
]
